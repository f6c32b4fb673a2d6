// Package fairqueue decides which waiting request goes next when a model's free KV cannot take
// them all: token-weighted fair share between tenants (a virtual token counter per tenant, as in
// "Fairness in Serving Large Language Models", OSDI 2024), or request-count round robin (the
// comparison point llm-d's flow control offers). It knows nothing of HTTP or engines: the
// caller says whether a request fits (and reserves it) and when a request's client is gone.
package fairqueue

import (
	"errors"
	"math"
	"slices"
	"sync"
	"time"
)

// Policy chooses the tenant served next among those with requests waiting.
type Policy int

const (
	// Fair serves the waiting tenant with the smallest weighted virtual token counter.
	Fair Policy = iota
	// RoundRobin serves waiting tenants one request each in turn, whatever the requests' size.
	RoundRobin
)

// ErrFull: the queue holds max_queued requests already (the caller answers 503 at once).
var ErrFull = errors.New("fairqueue: queue full")

// ErrTimeout: the request waited its whole timeout without fitting (the caller answers 429).
var ErrTimeout = errors.New("fairqueue: queue timeout")

// ErrGone: the request's client left while it waited; it was removed and charged nothing.
var ErrGone = errors.New("fairqueue: client gone")

// Ticket is one request: who sends it and the KV tokens it needs (prompt + reserved output).
type Ticket struct {
	Tenant string
	Tokens int64
	// Weight is the tenant's share (default 1 when ≤ 0): its counter grows by Tokens/Weight.
	Weight float64
	// Pool is the KV pool of the engine that holds the request (0: unknown). The request books
	// min(Tokens, Pool) (an engine cuts the output at its pool); a booking above the tenant's
	// share of the pool makes it large (see large).
	Pool int64
	// Value is the caller's own (the gateway's exchange); the queue never reads it.
	Value any

	ready      chan struct{} // closed at dispatch
	dispatched bool
	queued     bool
	settled    bool
	large      bool    // dispatched as large: charged its whole booking at settle
	held       float64 // its booking over its weight, in the tenant's held while in flight
}

// booking is what the request holds in the pool while it runs.
func (t *Ticket) booking() int64 {
	if t.Pool > 0 {
		return min(t.Tokens, t.Pool)
	}
	return t.Tokens
}

// Dispatched reports whether the ticket was dispatched (read under no lock only after Wait).
func (t *Ticket) Dispatched() bool { return t.dispatched }

// A tenant's virtual counter is settled + held: what its finished requests used (over its
// weight) plus the bookings of those in flight. The queue orders by the sum, so a booking counts
// while it holds KV; a newcomer is lifted to settled counters only, so a refund at settle (a
// generous max_tokens, a short reply) never puts the booker ahead of a tenant that arrived while
// the booking was held (issue 40's reserve-then-refund game).
type tenant struct {
	name     string
	settled  float64   // weighted tokens of finished requests (virtual time); never falls
	held     float64   // weighted bookings of requests in flight
	inflight int       // requests in flight (held is reset to 0 with none: no float residue)
	waiting  []*Ticket // FIFO within the tenant
}

func (t *tenant) counter() float64 { return t.settled + t.held }

// Queue is one model's queue. The zero value is not usable; use New.
type Queue struct {
	mu        sync.Mutex
	policy    Policy
	maxQueued int
	tenants   map[string]*tenant
	backlog   []*tenant // tenants with requests waiting, in arrival order (round robin turns)
	rr        int       // round robin: the index in backlog served next
	queued    int
	lastLift  float64 // the settled counter of the last tenant served: floor for one that comes back to an idle queue
}

// New returns an empty queue holding at most maxQueued waiting requests (≤ 0: unbounded).
func New(p Policy, maxQueued int) *Queue {
	return &Queue{policy: p, maxQueued: maxQueued, tenants: map[string]*tenant{}}
}

// Len is the number of waiting requests.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queued
}

// LenOf is the number of requests tenant has waiting.
func (q *Queue) LenOf(tenantName string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.tenants[tenantName]; t != nil {
		return len(t.waiting)
	}
	return 0
}

// Counter is the tenant's virtual token counter, settled + held (tests and the status page).
func (q *Queue) Counter(tenantName string) float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.tenants[tenantName]; t != nil {
		return t.counter()
	}
	return 0
}

// Submit queues t and dispatches whatever fits now (t included, when its turn has come and it
// fits). fits is asked about the request chosen next; it returns true only after reserving the
// request's tokens (so the next call sees them taken). Submit returns ErrFull when the queue is
// at its bound and t does not dispatch at once.
func (q *Queue) Submit(t *Ticket, fits func(*Ticket) bool) error {
	if t.Weight <= 0 {
		t.Weight = 1
	}
	t.ready = make(chan struct{})
	q.mu.Lock()
	defer q.mu.Unlock()
	ten := q.tenants[t.Tenant]
	if ten == nil {
		ten = &tenant{name: t.Tenant}
		q.tenants[t.Tenant] = ten
	}
	if len(ten.waiting) == 0 {
		q.lift(ten)
		q.backlog = append(q.backlog, ten)
	}
	ten.waiting = append(ten.waiting, t)
	t.queued = true
	q.queued++
	q.dispatchLocked(fits)
	if !t.dispatched && q.maxQueued > 0 && q.queued > q.maxQueued {
		q.removeLocked(t)
		return ErrFull
	}
	return nil
}

// lift raises a newly backlogged tenant's settled counter to the smallest settled counter among
// the tenants waiting (or, with none waiting, to the last one served), so time spent idle is not
// banked as credit that would let it shut the others out on return. Settled, not settled + held:
// a floor that holds others' bookings would let their refunds overtake the newcomer.
func (q *Queue) lift(ten *tenant) {
	floor := q.lastLift
	if len(q.backlog) > 0 {
		floor = q.backlog[0].settled
		for _, b := range q.backlog[1:] {
			floor = min(floor, b.settled)
		}
	}
	ten.settled = max(ten.settled, floor)
}

// Dispatch dispatches waiting requests while the one chosen next fits (call it when KV frees:
// a request finished, or a fresh load reading came).
func (q *Queue) Dispatch(fits func(*Ticket) bool) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dispatchLocked(fits)
}

func (q *Queue) dispatchLocked(fits func(*Ticket) bool) int {
	n := 0
	var passed []*tenant // fair: tenants whose large head did not fit, passed this round
	horizon := math.Inf(1)
	for {
		i := q.next(passed)
		if i < 0 {
			return n
		}
		ten := q.backlog[i]
		t := ten.waiting[0]
		if q.policy == Fair && ten.counter() > horizon {
			return n // the passed large head's turn: the others wait with it while the pool drains
		}
		if !fits(t) {
			if q.policy == Fair && q.large(t) {
				// A large head waits for room without holding the others back, but only until
				// they have been served as much as its booking (its finish tag): then nobody
				// passes and the pool drains for it. So a whole-pool request neither blocks the
				// queue nor starves.
				passed = append(passed, ten)
				horizon = min(horizon, ten.counter()+float64(t.booking())/t.Weight)
				continue
			}
			// The chosen request waits for room rather than a later, smaller one overtaking it:
			// otherwise a tenant of large requests could wait for ever behind small ones.
			return n
		}
		t.large = q.policy == Fair && q.large(t)
		ten.waiting = ten.waiting[1:]
		t.queued = false
		q.queued--
		t.held = float64(t.booking()) / t.Weight
		ten.held += t.held
		ten.inflight++
		q.lastLift = ten.settled
		if len(ten.waiting) == 0 {
			q.dropBacklog(i)
		} else if q.policy == RoundRobin {
			q.rr = i + 1
		}
		t.dispatched = true
		close(t.ready)
		n++
	}
}

// large: t's booking is more than its tenant's share of the pool and more than half of it (the
// whole-pool lock of issue 40: a request whose prompt + max_tokens exceeds the pool books the
// whole pool). With one tenant waiting nothing is large: it may have the whole pool.
func (q *Queue) large(t *Ticket) bool {
	if t.Pool <= 0 || len(q.backlog) < 2 {
		return false
	}
	wsum := 0.0
	for _, b := range q.backlog {
		wsum += b.waiting[0].Weight
	}
	share := float64(t.Pool) * t.Weight / wsum
	return float64(t.booking()) > max(float64(t.Pool)/2, share)
}

// next is the index in backlog of the tenant served next, -1 when every waiting tenant was
// passed.
func (q *Queue) next(passed []*tenant) int {
	if len(q.backlog) == 0 {
		return -1
	}
	if q.policy == RoundRobin {
		if q.rr >= len(q.backlog) {
			q.rr = 0
		}
		return q.rr
	}
	best := -1
	for i, b := range q.backlog {
		if slices.Contains(passed, b) {
			continue
		}
		if best < 0 || b.counter() < q.backlog[best].counter() {
			best = i
		}
	}
	return best
}

func (q *Queue) dropBacklog(i int) {
	q.backlog = append(q.backlog[:i], q.backlog[i+1:]...)
	if q.rr > i {
		q.rr--
	}
}

// Cancel removes a waiting request (its client left, or it timed out); it is charged nothing.
// It reports false when t was already dispatched (the caller then owns a reservation).
func (q *Queue) Cancel(t *Ticket) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !t.queued {
		return false
	}
	q.removeLocked(t)
	return true
}

func (q *Queue) removeLocked(t *Ticket) {
	ten := q.tenants[t.Tenant]
	for i, w := range ten.waiting {
		if w == t {
			ten.waiting = append(ten.waiting[:i], ten.waiting[i+1:]...)
			break
		}
	}
	t.queued = false
	q.queued--
	if len(ten.waiting) == 0 {
		for i, b := range q.backlog {
			if b == ten {
				q.dropBacklog(i)
				break
			}
		}
	}
}

// Settle ends a dispatched request's hold and charges its tenant what the reply really used
// (prompt + generated output), as VTC charges tokens served rather than reserved: less than the
// booking when the reply was short, more when it ran past it (charged in full). usedTokens < 0
// (no usage known: an engine error) charges the booking. A large request is charged at least
// its whole booking (the others could not use that KV meanwhile), and every request at least one
// token, so neither whole-pool asks nor floods of empty requests are free. Once per ticket.
func (q *Queue) Settle(t *Ticket, usedTokens int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !t.dispatched || t.settled {
		return
	}
	t.settled = true
	ten := q.tenants[t.Tenant]
	used := usedTokens
	if used < 0 || t.large {
		used = max(used, t.booking())
	}
	ten.settled += float64(max(used, 1)) / t.Weight
	ten.held -= t.held
	if ten.inflight--; ten.inflight == 0 {
		ten.held = 0
	}
}

// Wait blocks until t is dispatched (nil), timeout fires (ErrTimeout), or gone closes (ErrGone).
// A request dispatched in the same instant as its timeout or its client leaving is dispatched:
// the caller owns its reservation and releases it. The channels are the caller's clock: tests
// drive them by hand.
func (q *Queue) Wait(t *Ticket, timeout <-chan time.Time, gone <-chan struct{}) error {
	select {
	case <-t.ready:
		return nil
	case <-timeout:
		if q.Cancel(t) {
			return ErrTimeout
		}
	case <-gone:
		if q.Cancel(t) {
			return ErrGone
		}
	}
	<-t.ready
	return nil
}
