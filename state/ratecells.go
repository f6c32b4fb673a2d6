package state

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/limits"
)

// RedisLimits keeps every tenant's cells in Redis, shared by every replica with the same prefix
// (Keys.LimitCells): prefix+"{rl:"+tenant+"}:r" (requests) and ":t" (tokens) hold GCRA
// theoretical arrival times in milliseconds of Redis's own clock (so replicas' clocks do not
// matter), ":c" is a sorted set of concurrency leases scored by expiry. A tenant's keys share
// their hash tag, so one script touches them all on one Cluster slot, and different tenants land
// on different slots (and masters).
type RedisLimits struct {
	client redis.UniversalClient
	prefix string

	// Admissions that arrive while others are on the wire wait in queue and go together in the
	// next pipeline (auto-pipelining: one write and one read for many requests, on both sides,
	// instead of one each). Each still waits for its own verdict, bounded by its context.
	mu      sync.Mutex
	queue   []*admitCall
	sending bool // a sender goroutine is running
}

// admitCall is one admission waiting for the next pipeline, with the settlements it carries.
type admitCall struct {
	ctx    context.Context
	settle []limits.Settlement
	a      limits.Admission
	res    string // the script's verdict (see batchScript)
	err    error
	done   chan struct{}
}

// maxAdmitBatch bounds one pipeline's admissions.
const maxAdmitBatch = 128

// NewRedisLimits returns the shared store.
func NewRedisLimits(client redis.UniversalClient, prefix string) *RedisLimits {
	return &RedisLimits{client: client, prefix: prefix}
}

func (r *RedisLimits) keys(tenant string) []string { return Keys{r.prefix}.LimitCells(tenant) }

// batchScript is gcra (limits/limiter.go) in Lua, plus the lease set, over one tenant's cells for
// a run of operations in the order they were queued: settlements (move the token cell, free a
// lease) and admissions (check and charge). It reads Redis's clock once and each cell at most
// once, keeps the cells in Lua locals and writes each at most once at the end, so N requests
// sharing one pipeline cost one script call instead of 2N (issue 23: at saturation the scripts'
// own overhead, not the arithmetic, was most of redis-server's CPU). Each operation is decided as
// the one-call-per-operation scripts decided it (state/limits_internal_test.go keeps those as the
// reference and compares), at one instant for the whole run.
// KEYS: requests cell, tokens cell, lease set. ARGV[1]: lease ttl ms; then operations:
//
//	's', tpm, token delta, lease
//	'a', rpm, tpm, max_concurrent, tokens, lease, carry rpm ms, carry tpm ms, extra in flight, carry only (1|0), owable
//
// Returns, per admission in order, "allowed 0|1,refusing limit,retry ms,never 0|1,rpm fill ms,tpm
// fill ms": one string each (one reply element to write, read and allocate, not six).
var batchScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window = 60000
local ttl = tonumber(ARGV[1])
local cell, held, dirty = {}, {}, {}
local function get(k)
  if cell[k] == nil then
    local v = redis.call('GET', KEYS[k])
    held[k] = v ~= false
    cell[k] = tonumber(v or 0) or 0
  end
  return cell[k]
end
local function load(k, carry)
  local tat = get(k)
  if tat < now then tat = now end
  if carry > 0 then tat = math.max(tat, math.min(tat + carry, now + window)) end
  return tat
end
local function put(k, tat) cell[k] = tat; dirty[k] = true end
local leases, added = nil, false
local out = {}
local i = 2
while i <= #ARGV do
  if ARGV[i] == 's' then
    local tpm, delta, lease = tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), ARGV[i+3]
    i = i + 4
    if tpm > 0 and delta ~= 0 then put(2, math.max(get(2), now) + delta * window / tpm) end
    if lease ~= '' then
      local n = redis.call('ZREM', KEYS[3], lease)
      if leases then leases = leases - n end
    end
  else
    local rpm, tpm, maxc = tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), tonumber(ARGV[i+3])
    local tokens, lease = tonumber(ARGV[i+4]), ARGV[i+5]
    local crpm, ctpm, extra, only = tonumber(ARGV[i+6]), tonumber(ARGV[i+7]), tonumber(ARGV[i+8]), ARGV[i+9]
    local owable = tonumber(ARGV[i+10])
    i = i + 11
    local rtat, ttat = now, now
    if rpm > 0 then rtat = load(1, crpm) end
    if tpm > 0 then ttat = load(2, ctpm) end
    if only == '1' then
      if rpm > 0 then put(1, rtat) end
      if tpm > 0 then put(2, ttat) end
      out[#out+1] = '0,,0,0,' .. tostring(rtat - now) .. ',' .. tostring(ttat - now)
    else
      local nr, nt = rtat, ttat
      local limit, retry, never = '', 0, 0
      if rpm > 0 then
        nr = rtat + window / rpm
        if nr - now > window + 1e-6 then limit = 'rpm'; retry = nr - now - window end
      end
      if limit == '' and tpm > 0 then
        nt = ttat + tokens * window / tpm
        local must = tokens - math.min(math.max(owable, 0), tokens)
        local fit = ttat + must * window / tpm
        if must > tpm then limit = 'tpm'; retry = 0; never = 1
        elseif fit - now > window + 1e-6 then limit = 'tpm'; retry = fit - now - window end
      end
      if limit == '' and maxc > 0 then
        if leases == nil then
          redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
          leases = redis.call('ZCARD', KEYS[3])
        end
        if leases + extra >= maxc then limit = 'max_concurrent'; retry = 1000 end
      end
      local allowed = 1
      if limit ~= '' then nr, nt, allowed = rtat, ttat, 0 end
      if rpm > 0 then put(1, nr) end
      if tpm > 0 then put(2, nt) end
      if allowed == 1 and maxc > 0 then
        leases = leases + redis.call('ZADD', KEYS[3], now + ttl, lease)
        added = true
      end
      out[#out+1] = allowed .. ',' .. limit .. ',' .. tostring(math.ceil(retry)) .. ',' .. never .. ',' ..
        tostring(math.max(nr - now, 0)) .. ',' .. tostring(math.max(nt - now, 0))
    end
  end
end
for k = 1, 2 do
  if dirty[k] then
    if cell[k] > now then
      redis.call('SET', KEYS[k], tostring(cell[k]), 'PX', math.ceil(cell[k] - now) + 1000)
    elseif held[k] then
      redis.call('DEL', KEYS[k])
    end
  end
end
if added then redis.call('PEXPIRE', KEYS[3], ttl * 2) end
return out`)

// renewScript: KEYS lease set; ARGV ttl ms, leases...: extend the leases that still exist.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return 0`)

var _ limits.BatchStore = (*RedisLimits)(nil)

func (r *RedisLimits) Admit(ctx context.Context, a limits.Admission) (limits.Verdict, error) {
	return r.AdmitAfter(ctx, nil, a)
}

// AdmitAfter applies the settlements s, then decides a, in one round trip: the next pipeline,
// shared with the admissions that queued meanwhile (on a Cluster, one per master involved,
// sent together).
func (r *RedisLimits) AdmitAfter(ctx context.Context, s []limits.Settlement, a limits.Admission) (limits.Verdict, error) {
	c := &admitCall{ctx: ctx, settle: s, a: a, done: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, c)
	start := !r.sending
	r.sending = true
	r.mu.Unlock()
	if start {
		go r.send()
	}
	select {
	case <-c.done:
		return r.verdict(a, c.res, c.err)
	case <-ctx.Done():
		// Its pipeline may still run (as a call that timed out may have): the safe side.
		return limits.Verdict{}, fmt.Errorf("rate limit check for tenant %q: %w", a.Tenant, ctx.Err())
	}
}

// send pipelines queued admissions until none is left, then ends (the next one starts another).
func (r *RedisLimits) send() {
	for {
		r.mu.Lock()
		batch := r.queue
		if len(batch) > maxAdmitBatch {
			batch = batch[:maxAdmitBatch]
		}
		r.queue = r.queue[len(batch):]
		if len(batch) == 0 {
			r.queue, r.sending = nil, false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.sendBatch(batch)
	}
}

// tenantRun is one tenant's operations in one pipeline: one batchScript call.
type tenantRun struct {
	tenant  string
	args    []any
	admits  []*admitCall // in order: the script's results come back in the same order
	carried []*admitCall // calls whose settlements ride in this run: they fail with it
	cmd     *redis.Cmd
	res     []string
	err     error

	// The last operation, while it is a settlement: where its token delta is in args, and its tpm.
	lastDelta int
	lastTPM   int
}

// settle appends st. Consecutive settlements with the same tpm and token deltas of the same sign
// are one move of the token cell by their sum (exact: a run of charges never reaches the floor at
// now, and a run of refunds that reaches it stays there either way), so the script does one
// step, not one per request; their leases follow as lease-only operations.
func (t *tenantRun) settle(st limits.Settlement) {
	if t.lastDelta > 0 && t.lastTPM == st.Rates.TPM {
		if sum := t.args[t.lastDelta].(int64); sum >= 0 && st.TokenDelta >= 0 || sum <= 0 && st.TokenDelta <= 0 {
			t.args[t.lastDelta] = sum + st.TokenDelta
			if st.Lease == "" {
				return
			}
			st.TokenDelta = 0
		}
	}
	t.args = append(t.args, "s", st.Rates.TPM, st.TokenDelta, st.Lease)
	t.lastDelta, t.lastTPM = len(t.args)-2, st.Rates.TPM
}

func (t *tenantRun) admit(a limits.Admission) {
	t.args = append(t.args, "a", a.Rates.RPM, a.Rates.TPM, a.Rates.MaxConcurrent, a.Tokens, a.Lease,
		strconv.FormatFloat(a.CarryRPM, 'f', 3, 64), strconv.FormatFloat(a.CarryTPM, 'f', 3, 64), a.ExtraInflight, b01(a.CarryOnly), a.Owable)
	t.lastDelta = 0
}

// runs groups operations by tenant (one script call per tenant, on its own Cluster slot), each
// tenant's in the order given.
type runs struct {
	list []*tenantRun
	by   map[string]*tenantRun
}

func (rs *runs) of(tenant string) *tenantRun {
	if t := rs.by[tenant]; t != nil {
		return t
	}
	t := &tenantRun{tenant: tenant, args: []any{limits.LeaseTTL.Milliseconds()}}
	if rs.by == nil {
		rs.by = map[string]*tenantRun{}
	}
	rs.by[tenant] = t
	rs.list = append(rs.list, t)
	return t
}

// exec sends every run in one pipeline (on a Cluster, one per master involved, sent together)
// and reads each run's result. A run Redis refused for want of the script (NOSCRIPT: Redis
// restarted or its scripts were flushed) did not run: it is sent again with the script's text.
func (r *RedisLimits) exec(ctx context.Context, rs *runs) {
	if len(rs.list) == 1 { // no pipeline wrapper for the common case: one tenant
		t := rs.list[0]
		t.res, t.err = batchScript.Run(ctx, r.client, r.keys(t.tenant), t.args...).StringSlice()
	} else {
		_, _ = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, t := range rs.list {
				t.cmd = batchScript.EvalSha(ctx, p, r.keys(t.tenant), t.args...)
			}
			return nil
		})
		for _, t := range rs.list {
			t.res, t.err = t.cmd.StringSlice()
			if isNoScript(t.err) {
				t.res, t.err = batchScript.Run(ctx, r.client, r.keys(t.tenant), t.args...).StringSlice()
			}
		}
	}
	for _, t := range rs.list {
		if t.err == nil && len(t.res) != len(t.admits) {
			t.err = fmt.Errorf("unexpected reply of %d verdicts for %d admissions", len(t.res), len(t.admits))
		}
	}
}

// sendBatch runs one pipeline: each call's settlements, then its admission, grouped by tenant
// (a tenant's operations keep their order; different tenants' cells are independent). Its
// deadline is the latest of the calls' (a caller that gives up earlier stops waiting on its own).
// A call fails if its admission's run failed or a run carrying its settlements did: the limiter
// then turns degraded, as when its own round trip failed.
func (r *RedisLimits) sendBatch(batch []*admitCall) {
	ctx := context.Background()
	var deadline time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			deadline = time.Time{}
			break
		}
		if d.After(deadline) {
			deadline = d
		}
	}
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	var rs runs
	for _, c := range batch {
		for _, st := range c.settle {
			t := rs.of(st.Tenant)
			t.settle(st)
			if n := len(t.carried); n == 0 || t.carried[n-1] != c {
				t.carried = append(t.carried, c)
			}
		}
		t := rs.of(c.a.Tenant)
		t.admit(c.a)
		t.admits = append(t.admits, c)
	}
	r.exec(ctx, &rs)
	for _, t := range rs.list {
		for _, c := range t.carried {
			if t.err != nil && c.err == nil {
				c.err = t.err
			}
		}
	}
	for _, t := range rs.list {
		for k, c := range t.admits {
			if c.err == nil {
				c.err = t.err
			}
			if c.err == nil {
				c.res = t.res[k]
			}
			close(c.done)
		}
	}
}

// SettleBatch applies every settlement in one pipelined round trip, one script call per tenant.
func (r *RedisLimits) SettleBatch(ctx context.Context, s []limits.Settlement) error {
	var rs runs
	for _, st := range s {
		rs.of(st.Tenant).settle(st)
	}
	r.exec(ctx, &rs)
	for _, t := range rs.list {
		if t.err != nil {
			return fmt.Errorf("settling tenant %q: %w", t.tenant, t.err)
		}
	}
	return nil
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

func (r *RedisLimits) verdict(a limits.Admission, res string, err error) (limits.Verdict, error) {
	if err != nil {
		return limits.Verdict{}, fmt.Errorf("rate limit check for tenant %q: %w", a.Tenant, err)
	}
	var f [6]string
	rest := res
	for i := range f {
		var ok bool
		if f[i], rest, ok = strings.Cut(rest, ","); !ok && i < len(f)-1 {
			return limits.Verdict{}, fmt.Errorf("rate limit check: unexpected reply %q", res)
		}
	}
	num := func(s string) float64 {
		v, _ := strconv.ParseFloat(s, 64)
		return v
	}
	v := limits.Verdict{Allowed: f[0] == "1", RetryAfter: time.Duration(num(f[2])) * time.Millisecond,
		Never: f[3] == "1", RPMFill: num(f[4]), TPMFill: num(f[5])}
	switch f[1] { // the package's constants: the reply's bytes are not kept
	case "":
	case limits.RPM:
		v.Limit = limits.RPM
	case limits.TPM:
		v.Limit = limits.TPM
	case limits.Concurrent:
		v.Limit = limits.Concurrent
	default:
		return limits.Verdict{}, fmt.Errorf("rate limit check: unexpected limit in reply %q", res)
	}
	return v, nil
}

func (r *RedisLimits) Settle(ctx context.Context, tenant string, lim limits.Rates, tokenDelta int64, lease string) error {
	if (lim.TPM <= 0 || tokenDelta == 0) && lease == "" {
		return nil // nothing to move: no round trip
	}
	var rs runs
	rs.of(tenant).settle(limits.Settlement{Tenant: tenant, Rates: lim, TokenDelta: tokenDelta, Lease: lease})
	r.exec(ctx, &rs)
	if err := rs.list[0].err; err != nil {
		return fmt.Errorf("settling tenant %q: %w", tenant, err)
	}
	return nil
}

func (r *RedisLimits) Renew(ctx context.Context, leases map[string]string) error {
	byTenant := map[string][]any{}
	for lease, tenant := range leases {
		byTenant[tenant] = append(byTenant[tenant], lease)
	}
	// One call per tenant, every limits.LeaseTTL/4: off the request path, so no pipelining needed.
	for tenant, ls := range byTenant {
		if err := renewScript.Run(ctx, r.client, []string{r.keys(tenant)[2]}, append([]any{limits.LeaseTTL.Milliseconds()}, ls...)...).Err(); err != nil {
			return fmt.Errorf("renewing concurrency leases: %w", err)
		}
	}
	return nil
}

func (r *RedisLimits) Ping(ctx context.Context) error { return r.client.Ping(ctx).Err() }

// heartbeatScript: KEYS replica set; ARGV replica id, ttl ms. Registers the replica and returns
// how many have beaten within ttl.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])`)

// Heartbeat registers replica id as alive and returns how many replicas beat within the last
// 5 s: the replica count a local share divides by when Redis later becomes unreachable.
func (r *RedisLimits) Heartbeat(ctx context.Context, id string) (int, error) {
	n, err := heartbeatScript.Run(ctx, r.client, []string{Keys{r.prefix}.Replicas()}, id, 5000).Int()
	if err != nil {
		return 0, fmt.Errorf("replica heartbeat: %w", err)
	}
	return n, nil
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}
