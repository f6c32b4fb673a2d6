package state

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/policy"
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
	settle []policy.Settlement
	a      policy.Admission
	res    []any
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

// admitScript is gcra (limits.go) in Lua, plus the lease set.
// KEYS: requests cell, tokens cell, lease set.
// ARGV: rpm, tpm, max_concurrent, tokens, lease, lease ttl ms, carry rpm ms, carry tpm ms,
// extra in flight, carry only (1|0).
// Returns {allowed 0|1, refusing limit, retry ms, never 0|1, rpm fill ms, tpm fill ms}.
var admitScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local window = 60000
local function load(key, carry)
  local tat = tonumber(redis.call('GET', key) or 0) or 0
  if tat < now then tat = now end
  if carry > 0 then tat = math.min(tat + carry, now + window) end
  return tat
end
local rtat, ttat = now, now
if rpm > 0 then rtat = load(KEYS[1], tonumber(ARGV[7])) end
if tpm > 0 then ttat = load(KEYS[2], tonumber(ARGV[8])) end
local nr, nt = rtat, ttat
local limit, retry, never = '', 0, 0
local function store(key, tat)
  if tat > now then redis.call('SET', key, tostring(tat), 'PX', math.ceil(tat - now) + 1000) end
end
if ARGV[10] == '1' then
  if rpm > 0 then store(KEYS[1], rtat) end
  if tpm > 0 then store(KEYS[2], ttat) end
  return {0, '', '0', 0, tostring(rtat - now), tostring(ttat - now)}
end
if rpm > 0 then
  nr = rtat + window / rpm
  if nr - now > window + 1e-6 then limit = 'rpm'; retry = nr - now - window end
end
if limit == '' and tpm > 0 then
  nt = ttat + tokens * window / tpm
  if tokens > tpm then limit = 'tpm'; retry = window; never = 1
  elseif nt - now > window + 1e-6 then limit = 'tpm'; retry = nt - now - window end
end
if limit == '' and maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) + tonumber(ARGV[9]) >= maxc then limit = 'max_concurrent'; retry = 1000 end
end
local allowed = 1
if limit ~= '' then nr, nt, allowed = rtat, ttat, 0 end
if rpm > 0 then store(KEYS[1], nr) end
if tpm > 0 then store(KEYS[2], nt) end
if allowed == 1 and maxc > 0 then
  local ttl = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[5])
  redis.call('PEXPIRE', KEYS[3], ttl * 2)
end
return {allowed, limit, tostring(math.ceil(retry)), never, tostring(math.max(nr - now, 0)), tostring(math.max(nt - now, 0))}`)

// settleScript: KEYS tokens cell, lease set; ARGV tpm, token delta, lease.
var settleScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and delta ~= 0 then
  local tat = tonumber(redis.call('GET', KEYS[1]) or 0) or 0
  tat = math.max(tat, now) + delta * 60000 / tpm
  if tat > now then
    redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil(tat - now) + 1000)
  else
    redis.call('DEL', KEYS[1])
  end
end
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[2], ARGV[3]) end
return 0`)

// renewScript: KEYS lease set; ARGV ttl ms, leases...: extend the leases that still exist.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return 0`)

var _ policy.BatchStore = (*RedisLimits)(nil)

func (r *RedisLimits) admitArgs(a policy.Admission) []any {
	return []any{a.Limits.RPM, a.Limits.TPM, a.Limits.MaxConcurrent, a.Tokens, a.Lease, policy.LeaseTTL.Milliseconds(),
		strconv.FormatFloat(a.CarryRPM, 'f', 3, 64), strconv.FormatFloat(a.CarryTPM, 'f', 3, 64), a.ExtraInflight, b01(a.CarryOnly)}
}

func (r *RedisLimits) Admit(ctx context.Context, a policy.Admission) (policy.Verdict, error) {
	return r.AdmitAfter(ctx, nil, a)
}

// AdmitAfter applies the settlements s, then decides a, in one round trip: the next pipeline,
// shared with the admissions that queued meanwhile (on a Cluster, one per master involved,
// sent together).
func (r *RedisLimits) AdmitAfter(ctx context.Context, s []policy.Settlement, a policy.Admission) (policy.Verdict, error) {
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
		return policy.Verdict{}, fmt.Errorf("rate limit check for tenant %q: %w", a.Tenant, ctx.Err())
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

// sendBatch runs one pipeline: each call's settlements, then its admission. Its deadline is the
// latest of the calls' (a caller that gives up earlier stops waiting on its own).
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
	settles := make([][]*redis.Cmd, len(batch))
	admits := make([]*redis.Cmd, len(batch))
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range batch {
			for _, st := range c.settle {
				k := r.keys(st.Tenant)
				settles[i] = append(settles[i], settleScript.EvalSha(ctx, p, []string{k[1], k[2]}, st.Limits.TPM, st.TokenDelta, st.Lease))
			}
			admits[i] = admitScript.EvalSha(ctx, p, r.keys(c.a.Tenant), r.admitArgs(c.a)...)
		}
		return nil
	})
	for i, c := range batch {
		c.err = nil
		for k, cmd := range settles[i] {
			if isNoScript(cmd.Err()) { // not run: again with the script's text
				st := c.settle[k]
				kk := r.keys(st.Tenant)
				if e := settleScript.Run(ctx, r.client, []string{kk[1], kk[2]}, st.Limits.TPM, st.TokenDelta, st.Lease).Err(); e != nil && c.err == nil {
					c.err = e
				}
			} else if cmd.Err() != nil && c.err == nil {
				c.err = cmd.Err()
			}
		}
		if c.err == nil {
			c.res, c.err = admits[i].Slice()
			if isNoScript(c.err) {
				c.res, c.err = admitScript.Run(ctx, r.client, r.keys(c.a.Tenant), r.admitArgs(c.a)...).Slice()
			}
		}
		if c.err == nil && err != nil && !isNoScript(err) && admits[i].Err() != nil {
			c.err = err
		}
		close(c.done)
	}
}

// SettleBatch applies every settlement in one pipelined round trip. A settlement the server
// refused for want of the script (NOSCRIPT: Redis restarted or its scripts were flushed) did not
// run: it is sent again with the script's text, alone.
func (r *RedisLimits) SettleBatch(ctx context.Context, s []policy.Settlement) error {
	cmds := make([]*redis.Cmd, 0, len(s))
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, st := range s {
			k := r.keys(st.Tenant)
			cmds = append(cmds, settleScript.EvalSha(ctx, p, []string{k[1], k[2]}, st.Limits.TPM, st.TokenDelta, st.Lease))
		}
		return nil
	})
	if err != nil && !isNoScript(err) {
		return fmt.Errorf("settling %d requests: %w", len(s), err)
	}
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			k := r.keys(s[i].Tenant)
			if e := settleScript.Run(ctx, r.client, []string{k[1], k[2]}, s[i].Limits.TPM, s[i].TokenDelta, s[i].Lease).Err(); e != nil {
				return fmt.Errorf("settling tenant %q: %w", s[i].Tenant, e)
			}
		} else if c.Err() != nil {
			return fmt.Errorf("settling tenant %q: %w", s[i].Tenant, c.Err())
		}
	}
	return nil
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

func (r *RedisLimits) verdict(a policy.Admission, res []any, err error) (policy.Verdict, error) {
	if err != nil {
		return policy.Verdict{}, fmt.Errorf("rate limit check for tenant %q: %w", a.Tenant, err)
	}
	if len(res) != 6 {
		return policy.Verdict{}, fmt.Errorf("rate limit check: unexpected reply %v", res)
	}
	num := func(v any) float64 {
		switch x := v.(type) {
		case int64:
			return float64(x)
		case string:
			f, _ := strconv.ParseFloat(x, 64)
			return f
		}
		return 0
	}
	limit, _ := res[1].(string)
	return policy.Verdict{Allowed: num(res[0]) == 1, Limit: limit, RetryAfter: time.Duration(num(res[2])) * time.Millisecond,
		Never: num(res[3]) == 1, RPMFill: num(res[4]), TPMFill: num(res[5])}, nil
}

func (r *RedisLimits) Settle(ctx context.Context, tenant string, lim policy.Limits, tokenDelta int64, lease string) error {
	if (lim.TPM <= 0 || tokenDelta == 0) && lease == "" {
		return nil // nothing to move: no round trip
	}
	k := r.keys(tenant)
	if err := settleScript.Run(ctx, r.client, []string{k[1], k[2]}, lim.TPM, tokenDelta, lease).Err(); err != nil {
		return fmt.Errorf("settling tenant %q: %w", tenant, err)
	}
	return nil
}

func (r *RedisLimits) Renew(ctx context.Context, leases map[string]string) error {
	byTenant := map[string][]any{}
	for lease, tenant := range leases {
		byTenant[tenant] = append(byTenant[tenant], lease)
	}
	// One call per tenant, every policy.LeaseTTL/4: off the request path, so no pipelining needed.
	for tenant, ls := range byTenant {
		if err := renewScript.Run(ctx, r.client, []string{r.keys(tenant)[2]}, append([]any{policy.LeaseTTL.Milliseconds()}, ls...)...).Err(); err != nil {
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
