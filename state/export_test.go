package state

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/limits"
)

// BatchItem is one queued admission with the settlements it carries.
type BatchItem struct {
	Settle []limits.Settlement
	Admit  limits.Admission
}

// AdmitBatchForTest decides items in one pipeline, as the queue does when they all arrived while
// another pipeline was on the wire.
func (r *RedisLimits) AdmitBatchForTest(ctx context.Context, items []BatchItem) ([]limits.Verdict, []error) {
	calls := make([]*admitCall, len(items))
	for i, it := range items {
		calls[i] = &admitCall{ctx: ctx, settle: it.Settle, a: it.Admit, done: make(chan struct{})}
	}
	r.sendBatch(calls)
	vs, errs := make([]limits.Verdict, len(items)), make([]error, len(items))
	for i, c := range calls {
		<-c.done
		vs[i], errs[i] = r.verdict(c.a, c.res, c.err)
	}
	return vs, errs
}

// PerRequestStore is the store before issue 23's batched script: one script call per admission
// and one per settlement, each reading the clock and the cells and writing them back. The batched
// script must decide every operation as these did.
type PerRequestStore struct{ R *RedisLimits }

func (p PerRequestStore) Admit(ctx context.Context, a limits.Admission) (limits.Verdict, error) {
	args := []any{a.Rates.RPM, a.Rates.TPM, a.Rates.MaxConcurrent, a.Tokens, a.Lease, limits.LeaseTTL.Milliseconds(),
		strconv.FormatFloat(a.CarryRPM, 'f', 3, 64), strconv.FormatFloat(a.CarryTPM, 'f', 3, 64), a.ExtraInflight, b01(a.CarryOnly), a.Owable}
	res, err := refAdmitScript.Run(ctx, p.R.client, p.R.keys(a.Tenant), args...).Slice()
	return refVerdict(a, res, err)
}

func (p PerRequestStore) Settle(ctx context.Context, tenant string, lim limits.Rates, delta int64, lease string) error {
	k := p.R.keys(tenant)
	return refSettleScript.Run(ctx, p.R.client, []string{k[1], k[2]}, lim.TPM, delta, lease).Err()
}

var refAdmitScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local window = 60000
local function load(key, carry)
  local tat = tonumber(redis.call('GET', key) or 0) or 0
  if tat < now then tat = now end
  if carry > 0 then tat = math.max(tat, math.min(tat + carry, now + window)) end
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
  local must = tokens - math.min(math.max(tonumber(ARGV[11]), 0), tokens)
  local fit = ttat + must * window / tpm
  if must > tpm then limit = 'tpm'; retry = 0; never = 1
  elseif fit - now > window + 1e-6 then limit = 'tpm'; retry = fit - now - window end
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

// refSettleScript: KEYS tokens cell, lease set; ARGV tpm, token delta, lease.
var refSettleScript = redis.NewScript(`
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

// refVerdict reads the per-request script's reply.
func refVerdict(a limits.Admission, res []any, err error) (limits.Verdict, error) {
	if err != nil {
		return limits.Verdict{}, fmt.Errorf("rate limit check for tenant %q: %w", a.Tenant, err)
	}
	if len(res) != 6 {
		return limits.Verdict{}, fmt.Errorf("rate limit check: unexpected reply %v", res)
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
	return limits.Verdict{Allowed: num(res[0]) == 1, Limit: limit, RetryAfter: time.Duration(num(res[2])) * time.Millisecond,
		Never: num(res[3]) == 1, RPMFill: num(res[4]), TPMFill: num(res[5])}, nil
}
