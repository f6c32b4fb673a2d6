// Package limits enforces each tenant's request, token and concurrency rates (rpm, tpm,
// max_concurrent) with GCRA cells: in memory on one replica, or over a shared Store (state's
// Redis twin of the same algorithm) with a degraded share (limit / replicas, at least 1) while
// the store is unreachable. It owns this replica's limiter state and its background flush and
// renewal goroutines; it knows nothing of HTTP, engines or admission by tokens.
//
// The token rule, owing included. A request reserves T tokens (prompt + output to reserve), of
// which O may be owed (the caller's choice: the output a client did not bound). It passes tpm
// when T − O fits what is left of the tenant's bucket now, and is charged all of T, so the
// bucket may go up to O beyond empty: the tenant owes that. The next request passes only once the
// debt is repaid, by the bucket's refill or by the refund when a request settles for less than
// it reserved, so what a tenant is charged beyond its bucket is one request's O at most. A
// request whose T − O is more than the whole bucket (tpm) can never pass: Verdict.Never, with no
// RetryAfter (the client must ask for less, or the limit must grow). While degraded the same
// holds against the replica's share, except that a request over the share but within the
// tenant's limit is not Never (it fits once the store is back).
package limits

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"sync"
	"time"
)

// Rates are one tenant's rates. 0 means no limit; the burst of a per-minute limit is the limit
// itself (a tenant idle for a minute may spend a whole minute's worth at once).
type Rates struct {
	RPM           int `json:"rpm"`
	TPM           int `json:"tpm"`
	MaxConcurrent int `json:"max_concurrent"`
}

// None reports that no limit is set: such a tenant never touches the limiter.
func (l Rates) None() bool { return l.RPM <= 0 && l.TPM <= 0 && l.MaxConcurrent <= 0 }

// Names of the limits: metric labels and Verdict.Limit.
const (
	RPM        = "rpm"
	TPM        = "tpm"
	Concurrent = "max_concurrent"
)

// window is the GCRA tolerance in milliseconds: burst = the per-minute limit.
const window = 60000.0

// Admission is one request's claim on its tenant's limits.
type Admission struct {
	Tenant string
	Rates  Rates
	// Tokens are charged to the TPM cell: prompt + reserved output.
	Tokens int64
	// Owable is the part of Tokens that may be owed (see Owing below): charged even where the
	// cell has no room left for it, provided the rest (Tokens − Owable) fits. 0: all must fit.
	Owable int64
	// Lease names the concurrency slot (unique per request); used when MaxConcurrent > 0.
	Lease string
	// CarryRPM and CarryTPM (milliseconds of the shared cell) are what this replica admitted on
	// its own while the shared store was unreachable, decayed as the cell itself would; they are
	// added to the shared cells before the check (capped at a full window), so that shared
	// counting resumes without a burst.
	CarryRPM, CarryTPM float64
	// ExtraInflight are requests still in flight that this replica admitted on its own; they
	// count against MaxConcurrent.
	ExtraInflight int
	// CarryOnly adds the carry and admits nothing (the replica pushes what it admitted alone
	// the moment the shared store answers again, before serving from it).
	CarryOnly bool
}

// Verdict is the answer to one Admission.
type Verdict struct {
	Allowed bool
	// Limit names the limit that refused (RPM, TPM, Concurrent).
	Limit string
	// RetryAfter is when the request would fit again (for the Retry-After header); 0 when it
	// never will (Never).
	RetryAfter time.Duration
	// Never: the part of the request that must fit (Tokens − Owable) is more than the tenant's
	// whole TPM bucket, so no wait makes it pass: the client must ask for less (max_tokens, a
	// shorter prompt) or the limit must grow. RetryAfter is 0. While degraded, a request over
	// this replica's share but within the tenant's limit is not Never: it waits for the outage.
	Never bool
	// Degraded: the shared store was unreachable and this replica decided alone, against Share
	// (its share of the refusing limit) of the limit divided between Replicas.
	Degraded bool
	Share    int
	Replicas int
	// RPMFill and TPMFill are how full the cells are after the decision, in milliseconds of the
	// one-minute window (0 empty, 60000 full): a replica that loses the shared store starts
	// its local share from them instead of from empty.
	RPMFill, TPMFill float64
}

// Store keeps the limit cells. Admit checks every limit of the admission and charges all of
// them only if all pass, atomically (one Redis round trip for the Redis store). Settle moves the
// tenant's token cell by tokenDelta (negative: a refund) and frees the lease. Renew extends
// leases (lease → tenant) still in flight. Ping says whether the store answers.
type Store interface {
	Admit(ctx context.Context, a Admission) (Verdict, error)
	Settle(ctx context.Context, tenant string, lim Rates, tokenDelta int64, lease string) error
	Renew(ctx context.Context, leases map[string]string) error
	Ping(ctx context.Context) error
}

var (
	_ Store = (*Memory)(nil)
)

// Settlement is one ended request's correction of its tenant's cells: the token delta (charged
// or refunded) and the concurrency lease to free.
type Settlement struct {
	Tenant     string
	Rates      Rates
	TokenDelta int64
	Lease      string
}

// BatchStore is a Store that settles many requests in one round trip and can carry
// settlements in front of an admission, in the same round trip (issue 23: one Redis round trip
// per admitted request). SettleBatch applies every settlement or returns an error; AdmitAfter
// applies the settlements, then decides a.
type BatchStore interface {
	SettleBatch(ctx context.Context, s []Settlement) error
	AdmitAfter(ctx context.Context, s []Settlement, a Admission) (Verdict, error)
}

// gcra decides a on cells whose theoretical arrival times are rtat and ttat (ms) with inflight
// requests holding slots, at now. It returns the cells' new values: charged when allowed, with
// only the carried usage added when refused. RedisLimits' script is the same algorithm in Lua
// (tested against this one).
//
// Owing: a request passes the TPM cell when the part of it that must fit, Tokens − Owable, fits
// the room left (the cell at most a window ahead of now once it is charged); the whole of Tokens
// is charged, so the cell may end up to Owable beyond a full window: the tenant owes that. Owed
// tokens are repaid, by the cell's refill or by the settlement's refund of what the request did
// not use, before the tenant's next request passes, since nothing fits a cell that is over a full
// window. So what a tenant is charged beyond its bucket is at most one request's Owable at any
// time. With Owable 0 this is plain GCRA.
func gcra(a Admission, now, rtat, ttat float64, inflight int) (float64, float64, Verdict) {
	lim := a.Rates
	load := func(tat, carry float64) float64 {
		tat = math.Max(tat, now)
		if carry > 0 {
			// Carried usage fills the cell up to a full window, never beyond, and never takes
			// away what the cell already owes.
			tat = math.Max(tat, math.Min(tat+carry, now+window))
		}
		return tat
	}
	if lim.RPM > 0 {
		rtat = load(rtat, a.CarryRPM)
	}
	if lim.TPM > 0 {
		ttat = load(ttat, a.CarryTPM)
	}
	nr, nt := rtat, ttat
	var v Verdict
	if a.CarryOnly {
		return rtat, ttat, Verdict{RPMFill: rtat - now, TPMFill: ttat - now}
	}
	refuse := func(limit string, retry float64) {
		v = Verdict{Limit: limit, RetryAfter: time.Duration(math.Ceil(retry)) * time.Millisecond}
	}
	if lim.RPM > 0 {
		nr = rtat + window/float64(lim.RPM)
		if nr-now > window+1e-6 {
			refuse(RPM, nr-now-window)
		}
	}
	if v.Limit == "" && lim.TPM > 0 {
		nt = ttat + float64(a.Tokens)*window/float64(lim.TPM)
		must := a.Tokens - min(max(a.Owable, 0), a.Tokens)
		fit := ttat + float64(must)*window/float64(lim.TPM)
		if must > int64(lim.TPM) {
			refuse(TPM, 0)
			v.Never = true
		} else if fit-now > window+1e-6 {
			refuse(TPM, fit-now-window)
		}
	}
	if v.Limit == "" && lim.MaxConcurrent > 0 && inflight+a.ExtraInflight >= lim.MaxConcurrent {
		refuse(Concurrent, 1000) // a slot frees when some reply ends: unknown, so soon
	}
	if v.Limit != "" {
		nr, nt = rtat, ttat
	} else {
		v.Allowed = true
	}
	v.RPMFill, v.TPMFill = math.Max(nr-now, 0), math.Max(nt-now, 0)
	return nr, nt, v
}

// settleTAT moves a token cell by delta tokens at now; a refund never takes it below now (an
// empty cell holds no credit beyond its burst).
func settleTAT(tat, now float64, tpm int, delta int64) float64 {
	return math.Max(math.Max(tat, now)+float64(delta)*window/float64(tpm), now)
}

func millis(t time.Time) float64 { return float64(t.UnixNano()) / 1e6 }

// Memory is the single-replica store, and every replica's local store while Redis is
// unreachable. Its leases never expire: they live and die with the process.
type Memory struct {
	mu    sync.Mutex
	cells map[string]*memCell
	now   func() time.Time
}

type memCell struct {
	rtat, ttat float64
	leases     map[string]struct{}
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{cells: map[string]*memCell{}, now: time.Now}
}

func (m *Memory) cell(tenant string) *memCell {
	c := m.cells[tenant]
	if c == nil {
		c = &memCell{leases: map[string]struct{}{}}
		m.cells[tenant] = c
	}
	return c
}

func (m *Memory) Admit(_ context.Context, a Admission) (Verdict, error) {
	now := millis(m.now())
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.cell(a.Tenant)
	var v Verdict
	c.rtat, c.ttat, v = gcra(a, now, c.rtat, c.ttat, len(c.leases))
	if v.Allowed && a.Rates.MaxConcurrent > 0 {
		c.leases[a.Lease] = struct{}{}
	}
	return v, nil
}

func (m *Memory) Settle(_ context.Context, tenant string, lim Rates, tokenDelta int64, lease string) error {
	now := millis(m.now())
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.cell(tenant)
	if lim.TPM > 0 && tokenDelta != 0 {
		c.ttat = settleTAT(c.ttat, now, lim.TPM, tokenDelta)
	}
	if lease != "" {
		delete(c.leases, lease)
	}
	if len(c.leases) == 0 && c.rtat <= now && c.ttat <= now {
		delete(m.cells, tenant) // an idle tenant costs nothing
	}
	return nil
}

func (m *Memory) Renew(context.Context, map[string]string) error { return nil }
func (m *Memory) Ping(context.Context) error                     { return nil }

// seed sets a tenant's rate cells to the given fill (ms of the window), as last seen in the
// shared store, unless the cell is already fuller.
func (m *Memory) seed(tenant string, rFill, tFill float64) {
	now := millis(m.now())
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.cell(tenant)
	c.rtat = math.Max(c.rtat, now+rFill)
	c.ttat = math.Max(c.ttat, now+tFill)
}

// resetRates forgets every rate cell (leases stay: those requests are still in flight).
func (m *Memory) resetRates() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for t, c := range m.cells {
		c.rtat, c.ttat = 0, 0
		if len(c.leases) == 0 {
			delete(m.cells, t)
		}
	}
}

// Inflight is how many slots tenant holds (tests, metrics).
func (m *Memory) Inflight(tenant string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.cells[tenant]; c != nil {
		return len(c.leases)
	}
	return 0
}

// Limiter enforces tenants' limits against a shared store (Redis) with a local fallback. With
// no shared store (one replica) it is the memory store with full limits. With one, every call
// is bounded by a timeout; an error or timeout makes the limiter degraded: from then on each
// replica enforces its share, limit / replicas rounded down, in memory, starting from how full
// the shared cells last were, until a background ping finds the store again. Shared counting
// then resumes with what this replica admitted meanwhile carried into the shared cells.
type Limiter struct {
	shared   Store // nil: memory only
	local    *Memory
	timeout  time.Duration
	replicas int
	// OnChange, if set, is called when the limiter becomes degraded (with the error) or
	// recovers (nil).
	OnChange func(degraded bool, err error)

	mu         sync.Mutex
	degraded   bool
	since      time.Time
	discovered int
	seeded     map[string]bool     // tenants whose local cells were seeded this outage
	lastFill   map[string]fill     // per tenant, from the last shared verdict
	carry      map[string]*carry   // per tenant, local admissions not yet in the shared cells
	inflight   map[string]int      // per tenant, local admissions still in flight
	leases     map[string]string   // shared leases in flight: lease → tenant (renewed)
	limitsOf   map[string]Rates    // the limits carry was measured against
	heartbeats func() (int, error) // optional replica discovery

	// Settlements of shared tickets wait in pending (under mu) until the next admission carries
	// them in its own round trip, or the flusher sends them (SettleDelay after the first, or at
	// once when SettleBatchMax wait): a request's end costs no round trip of its own.
	pending  []Settlement
	oldest   time.Time     // when the oldest of pending was made
	flushing bool          // a flusher goroutine is running
	kick     chan struct{} // wakes the flusher early (a full batch)
	flushMu  sync.Mutex    // held while a batch is in flight: Flush waits for it
}

type fill struct {
	r, t float64
	at   float64
}

// carry is a pair of GCRA cells at the full (shared) rate, fed by local admissions.
type carry struct{ r, t float64 }

// LeaseTTL is how long a concurrency slot in Redis outlives its last renewal: a replica that dies
// mid-request frees its slots within it. Live slots are renewed every LeaseTTL/4.
const LeaseTTL = 60 * time.Second

// NewLimiter builds a limiter. shared nil keeps everything in memory; replicas (≥ 1) is the
// configured replica count; timeout bounds every shared call.
func NewLimiter(shared Store, replicas int, timeout time.Duration) *Limiter {
	if timeout <= 0 {
		timeout = 100 * time.Millisecond
	}
	return &Limiter{shared: shared, local: NewMemory(), timeout: timeout, replicas: max(replicas, 1),
		seeded: map[string]bool{}, lastFill: map[string]fill{}, carry: map[string]*carry{},
		inflight: map[string]int{}, leases: map[string]string{}, limitsOf: map[string]Rates{},
		kick: make(chan struct{}, 1)}
}

// SettleDelay is how long a settlement waits for the next admission to carry it before the
// flusher sends it (with every other one waiting) on its own; SettleBatchMax settlements are
// sent at once. Settlements of one replica reach the shared cells in order with its admissions:
// an admission carries every settlement made before it.
const (
	SettleDelay    = time.Millisecond
	SettleBatchMax = 256
)

// Ticket is an admitted request's hold on its tenant's limits, settled once when it ends.
type Ticket struct {
	tenant   string
	lim      Rates // the limits the store charged (the local share while degraded)
	reserved int64
	owable   int64 // of reserved, what may be owed
	lease    string
	shared   bool
	settled  bool
}

// Reserved is what the ticket charged to the token cell.
func (t *Ticket) Reserved() int64 { return t.reserved }

// Rates are the limits the ticket was decided against: the tenant's, or this replica's share of
// them while the shared store is unreachable.
func (t *Ticket) Rates() Rates { return t.lim }

// Degraded reports whether limits are being enforced per replica (shared store unreachable).
func (l *Limiter) Degraded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.degraded
}

// Replicas is the replica count the local share divides by: the configured one or, if larger,
// the number of replicas whose heartbeats were last seen.
func (l *Limiter) Replicas() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.replicas, l.discovered)
}

// Share is lim divided between replicas, rounded down, and never below 1. A limit smaller than
// the replica count (max_concurrent: 1 on 2 replicas) gives each replica 1 while the shared store
// is unreachable: the tenant may then get up to replicas × its limit across the deployment for
// the outage, rather than be locked out with nothing in flight (the documented choice:
// availability over exactness, for small limits, during an outage only).
func Share(lim Rates, replicas int) Rates {
	div := func(v int) int {
		if v <= 0 {
			return 0
		}
		return max(v/replicas, 1)
	}
	return Rates{RPM: div(lim.RPM), TPM: div(lim.TPM), MaxConcurrent: div(lim.MaxConcurrent)}
}

func newLease() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Admit decides one request of tenant needing tokens, all of which must fit (AdmitOwing with
// nothing owable). A nil ticket with an allowed verdict means the tenant has no limits.
func (l *Limiter) Admit(tenant string, lim Rates, tokens int64) (*Ticket, Verdict) {
	return l.AdmitOwing(tenant, lim, tokens, 0)
}

// AdmitOwing decides one request of tenant reserving tokens, of which owable may be owed: the
// request passes when tokens − owable fit the tenant's TPM room, and is charged all of tokens
// (see gcra). The reservation of an output the client did not bound is what to make owable, so
// a tenant whose tpm is below the context can still send such a request, one at a time; Verdict
// Never marks one whose remaining part can never fit. A nil ticket with an allowed verdict means
// the tenant has no limits.
func (l *Limiter) AdmitOwing(tenant string, lim Rates, tokens, owable int64) (*Ticket, Verdict) {
	if lim.None() {
		return nil, Verdict{Allowed: true}
	}
	owable = min(max(owable, 0), tokens)
	t := &Ticket{tenant: tenant, lim: lim, reserved: tokens, owable: owable}
	if lim.MaxConcurrent > 0 {
		t.lease = newLease()
	}
	if l.shared == nil {
		v, _ := l.local.Admit(context.Background(), Admission{Tenant: tenant, Rates: lim, Tokens: tokens, Owable: owable, Lease: t.lease})
		return t, v
	}
	l.mu.Lock()
	degraded := l.degraded
	var a Admission
	var cr *carry
	if !degraded {
		a = Admission{Tenant: tenant, Rates: lim, Tokens: tokens, Owable: owable, Lease: t.lease, ExtraInflight: l.inflight[tenant]}
		if cr = l.carry[tenant]; cr != nil {
			now := millis(time.Now())
			a.CarryRPM, a.CarryTPM = math.Max(cr.r-now, 0), math.Max(cr.t-now, 0)
			delete(l.carry, tenant) // taken; put back if the call fails
		}
	}
	var settle []Settlement
	if !degraded && len(l.pending) > 0 {
		if _, ok := l.shared.(BatchStore); ok {
			settle, l.pending = l.pending, nil // carried by this admission's round trip
		}
	}
	l.mu.Unlock()
	if !degraded {
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		var v Verdict
		var err error
		if settle != nil {
			v, err = l.shared.(BatchStore).AdmitAfter(ctx, settle, a)
		} else {
			v, err = l.shared.Admit(ctx, a)
		}
		cancel()
		if err == nil {
			l.mu.Lock()
			l.lastFill[tenant] = fill{r: v.RPMFill, t: v.TPMFill, at: millis(time.Now())}
			if v.Allowed && t.lease != "" {
				l.leases[t.lease] = tenant
			}
			l.mu.Unlock()
			t.shared = true
			return t, v
		}
		l.mu.Lock()
		if cr != nil && l.carry[tenant] == nil {
			l.carry[tenant] = cr
		}
		l.mu.Unlock()
		l.setDegraded(err)
	}
	return l.admitLocal(t)
}

// admitLocal enforces this replica's share of t's limits.
func (l *Limiter) admitLocal(t *Ticket) (*Ticket, Verdict) {
	replicas := l.Replicas()
	share := Share(t.lim, replicas)
	l.mu.Lock()
	if !l.seeded[t.tenant] {
		l.seeded[t.tenant] = true
		if f, ok := l.lastFill[t.tenant]; ok {
			gone := millis(time.Now()) - f.at
			l.local.seed(t.tenant, math.Max(f.r-gone, 0), math.Max(f.t-gone, 0))
		}
	}
	l.mu.Unlock()
	full := t.lim
	t.lim = share
	v, _ := l.local.Admit(context.Background(), Admission{Tenant: t.tenant, Rates: share, Tokens: t.reserved, Owable: t.owable, Lease: t.lease})
	if !v.Allowed {
		v.Degraded, v.Replicas = true, replicas
		if v.Never && t.reserved-t.owable <= int64(full.TPM) {
			// Over this replica's share only: it passes once the shared store is back.
			v.Never, v.RetryAfter = false, time.Duration(window)*time.Millisecond
		}
		switch v.Limit {
		case RPM:
			v.Share = share.RPM
		case TPM:
			v.Share = share.TPM
		case Concurrent:
			v.Share = share.MaxConcurrent
		}
		return t, v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := millis(time.Now())
	cr := l.carry[t.tenant]
	if cr == nil {
		cr = &carry{}
		l.carry[t.tenant] = cr
	}
	if full.RPM > 0 {
		cr.r = math.Max(cr.r, now) + window/float64(full.RPM)
	}
	if full.TPM > 0 {
		cr.t = math.Max(cr.t, now) + float64(t.reserved)*window/float64(full.TPM)
	}
	l.limitsOf[t.tenant] = full
	if t.lease != "" {
		l.inflight[t.tenant]++
	}
	return t, v
}

// Settle ends t with used tokens actually consumed (prompt + output produced): the difference
// from the reservation is charged or refunded, and the concurrency slot is freed. Calling it
// twice, or with a nil ticket, does nothing.
func (l *Limiter) Settle(t *Ticket, used int64) {
	if t == nil || t.settled {
		return
	}
	t.settled = true
	used = max(used, 0) // a negative use would refund more than was reserved
	delta := used - t.reserved
	if !t.shared {
		_ = l.local.Settle(context.Background(), t.tenant, t.lim, delta, t.lease)
		if l.shared == nil {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if t.lease != "" {
			if l.inflight[t.tenant]--; l.inflight[t.tenant] <= 0 {
				delete(l.inflight, t.tenant)
			}
		}
		if cr := l.carry[t.tenant]; cr != nil && delta != 0 {
			if full := l.limitsOf[t.tenant]; full.TPM > 0 {
				cr.t = settleTAT(cr.t, millis(time.Now()), full.TPM, delta)
			}
		}
		return
	}
	l.mu.Lock()
	delete(l.leases, t.lease)
	degraded := l.degraded
	if degraded {
		l.mu.Unlock()
		// The shared cell keeps the reservation (conservative); the slot frees at LeaseTTL.
		return
	}
	if (t.lim.TPM <= 0 || delta == 0) && t.lease == "" {
		l.mu.Unlock()
		return // nothing to move
	}
	s := Settlement{Tenant: t.tenant, Rates: t.lim, TokenDelta: delta, Lease: t.lease}
	if _, ok := l.shared.(BatchStore); !ok {
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		defer cancel()
		if err := l.shared.Settle(ctx, s.Tenant, s.Rates, s.TokenDelta, s.Lease); err != nil {
			l.setDegraded(err)
		}
		return
	}
	if len(l.pending) == 0 {
		l.oldest = time.Now()
	}
	l.pending = append(l.pending, s)
	full := len(l.pending) >= SettleBatchMax
	start := !l.flushing
	l.flushing = true
	l.mu.Unlock()
	if start {
		go l.flushLoop()
	}
	if full {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// flushLoop sends the settlements no admission carried within SettleDelay (or a full batch at
// once) until none is left; then it ends, and the next Settle starts another.
func (l *Limiter) flushLoop() {
	t := time.NewTimer(SettleDelay)
	defer t.Stop()
	for {
		kicked := false
		select {
		case <-t.C:
		case <-l.kick:
			kicked = true
		}
		l.mu.Lock()
		wait := SettleDelay - time.Since(l.oldest)
		if len(l.pending) > 0 && !kicked && wait > 0 && len(l.pending) < SettleBatchMax {
			l.mu.Unlock() // an admission took the older ones: give the newer their own delay
			t.Reset(wait)
			continue
		}
		l.mu.Unlock()
		if !l.flushPending(context.Background(), true) {
			return
		}
		t.Reset(SettleDelay)
	}
}

// flushPending sends what waits in one round trip and reports whether the flusher should go on
// (exiting says so under mu, so a Settle never leaves a settlement without a flusher). A failed
// batch makes the limiter degraded; its settlements are dropped, as a settle that fails while
// degraded is: the shared cells keep the reservations (the conservative side).
func (l *Limiter) flushPending(ctx context.Context, flusher bool) bool {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	if len(batch) == 0 {
		if flusher {
			l.flushing = false
		}
		l.mu.Unlock()
		return false
	}
	l.mu.Unlock()
	c, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if err := l.shared.(BatchStore).SettleBatch(c, batch); err != nil {
		l.setDegraded(err)
	}
	return true
}

// Flush sends every settlement still waiting and waits for a batch in flight: at shutdown, so
// that nothing a replica charged or refunded is lost, and in tests that read the cells.
func (l *Limiter) Flush(ctx context.Context) {
	if _, ok := l.shared.(BatchStore); !ok {
		return
	}
	l.flushPending(ctx, false)
}

func (l *Limiter) setDegraded(err error) {
	l.mu.Lock()
	was := l.degraded
	if !was {
		l.degraded, l.since = true, time.Now()
		l.seeded = map[string]bool{}
		l.local.resetRates()
	}
	l.mu.Unlock()
	if !was && l.OnChange != nil {
		l.OnChange(true, err)
	}
}

// pushCarry adds what this replica admitted alone to the shared cells, so that no replica
// serves from them again before every replica's outage usage is in. What fails stays to carry.
func (l *Limiter) pushCarry(ctx context.Context) error {
	l.mu.Lock()
	pending := l.carry
	l.carry = map[string]*carry{}
	lims := make(map[string]Rates, len(pending))
	for t := range pending {
		lims[t] = l.limitsOf[t]
	}
	l.mu.Unlock()
	now := millis(time.Now())
	var err error
	for tenant, cr := range pending {
		if err == nil {
			a := Admission{Tenant: tenant, Rates: lims[tenant], CarryOnly: true,
				CarryRPM: math.Max(cr.r-now, 0), CarryTPM: math.Max(cr.t-now, 0)}
			c, cancel := context.WithTimeout(ctx, l.timeout)
			_, err = l.shared.Admit(c, a)
			cancel()
			if err == nil {
				continue
			}
		}
		l.mu.Lock()
		if l.carry[tenant] == nil {
			l.carry[tenant] = cr
		}
		l.mu.Unlock()
	}
	return err
}

// SetHeartbeat installs replica discovery: f registers this replica and returns how many are
// alive. Run calls it every second.
func (l *Limiter) SetHeartbeat(f func() (int, error)) { l.heartbeats = f }

// Run does the limiter's background work until ctx ends: while degraded, ping the shared store
// every 200 ms and recover when it answers; renew live leases; heartbeat.
func (l *Limiter) Run(ctx context.Context) {
	if l.shared == nil {
		return
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var lastRenew, lastBeat time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		if l.Degraded() {
			c, cancel := context.WithTimeout(ctx, l.timeout)
			err := l.shared.Ping(c)
			cancel()
			if err != nil || l.pushCarry(ctx) != nil {
				continue
			}
			l.mu.Lock()
			l.degraded = false
			l.mu.Unlock()
			if l.OnChange != nil {
				l.OnChange(false, nil)
			}
			lastRenew = time.Time{} // leases may have lapsed during the outage
		}
		if now.Sub(lastRenew) >= LeaseTTL/4 {
			l.mu.Lock()
			leases := make(map[string]string, len(l.leases))
			for k, v := range l.leases {
				leases[k] = v
			}
			l.mu.Unlock()
			if len(leases) > 0 {
				c, cancel := context.WithTimeout(ctx, time.Second)
				if err := l.shared.Renew(c, leases); err != nil {
					l.setDegraded(err)
				}
				cancel()
			}
			lastRenew = now
		}
		if l.heartbeats != nil && now.Sub(lastBeat) >= time.Second {
			lastBeat = now
			if n, err := l.heartbeats(); err == nil {
				l.mu.Lock()
				l.discovered = n
				l.mu.Unlock()
			}
		}
	}
}
