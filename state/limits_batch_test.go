package state_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
)

// roundTrips counts the client's round trips: each command sent alone and each pipeline, but
// not a new connection's handshake (HELLO, CLIENT SETINFO).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "client" && cmds[0].Name() != "hello" {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// redisMillis is Redis's clock in milliseconds (the cells are in its time).
func redisMillis(t *testing.T, c redis.UniversalClient) float64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return float64(now.UnixNano()) / 1e6
}

// Settlements are batched (carried by the next admission's round trip, or flushed together):
// N requests charged through the shared limiter, from several goroutines, leave exactly what
// they used in the token cell and no lease behind, and cost about one round trip each.
func TestBatchedSettlementLosesNothing(t *testing.T) {
	client, prefix := testRedis(t)
	rt := &roundTrips{}
	client.AddHook(rt)
	l := limits.NewLimiter(state.NewRedisLimits(client, prefix), 1, 2*time.Second)
	// tpm 60000: one token is one millisecond of the cell. Each request reserves 1000 and uses
	// 10, so a lost refund would leave 990 ms too much, a doubled one 990 ms too little.
	lim := limits.Rates{RPM: 1 << 30, TPM: 60000, MaxConcurrent: 1 << 20}
	const n, workers, used = 120, 6, 10
	warmScripts(t, l)
	before := redisMillis(t, client)
	rt.n.Store(0)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/workers; i++ {
				tk, v := l.Admit("acct", lim, 1000)
				if !v.Allowed {
					refused.Add(1)
					continue
				}
				l.Settle(tk, used)
			}
		}()
	}
	wg.Wait()
	l.Flush(context.Background())
	trips := rt.n.Load()
	after := redisMillis(t, client)
	if refused.Load() != 0 || l.Degraded() {
		t.Fatalf("refused %d, degraded %v", refused.Load(), l.Degraded())
	}
	keys := state.Keys{Prefix: prefix}.LimitCells("acct")
	tat, err := client.Get(context.Background(), keys[1]).Float64()
	if err != nil {
		t.Fatal(err)
	}
	// The cell never fell below Redis's clock (6 in flight hold 6 s), so it holds exactly the
	// first admission's time plus n × used ms.
	want := float64(n * used)
	if got := tat - before; got < want-1 || got > want+(after-before)+1 {
		t.Fatalf("token cell moved %.1f ms over %d requests, want %.0f (+ at most the %.1f ms the test took)", got, n, want, after-before)
	}
	if c := client.ZCard(context.Background(), keys[2]).Val(); c != 0 {
		t.Fatalf("%d concurrency leases left after every request settled", c)
	}
	t.Logf("%d requests (admit + settle): %d round trips", n, trips)
	// One admission each; settlements ride along or go in a few batches.
	if trips > n+n/10 {
		t.Fatalf("%d round trips for %d requests: settlements are not batched", trips, n)
	}
}

// warmScripts has Redis load the admission and settlement scripts (a first call costs a NOSCRIPT
// round trip more), through a tenant of its own.
func warmScripts(t *testing.T, l *limits.Limiter) {
	t.Helper()
	tk, v := l.Admit("warm", limits.Rates{TPM: 1 << 20, MaxConcurrent: 1}, 10)
	if !v.Allowed {
		t.Fatalf("warm-up: %+v", v)
	}
	l.Settle(tk, 1)
	l.Flush(context.Background())
}

// A settlement the admission after it carries is applied before that admission is decided: one
// replica's requests see their own ends at once (a max_concurrent 1 tenant whose request ended
// is admitted again), in one round trip.
func TestSettlementRidesTheNextAdmission(t *testing.T) {
	client, prefix := testRedis(t)
	rt := &roundTrips{}
	client.AddHook(rt)
	l := limits.NewLimiter(state.NewRedisLimits(client, prefix), 1, 2*time.Second)
	lim := limits.Rates{MaxConcurrent: 1}
	warmScripts(t, l)
	tk, v := l.Admit("one", lim, 0)
	if !v.Allowed {
		t.Fatal("first request")
	}
	l.Settle(tk, 0)
	rt.n.Store(0)
	if _, v := l.Admit("one", lim, 0); !v.Allowed {
		t.Fatalf("the first request ended before the second began: %+v", v)
	}
	if got := rt.n.Load(); got != 1 {
		t.Fatalf("admission with the carried settlement took %d round trips", got)
	}
}

// A script Redis forgot (restart, SCRIPT FLUSH) is loaded again: batched settlements are applied
// once each, not lost and not doubled.
func TestBatchedSettlementAfterScriptFlush(t *testing.T) {
	_, client := privateRedis(t) // SCRIPT FLUSH is server-wide
	prefix := "p:"
	s := state.NewRedisLimits(client, prefix)
	ctx := context.Background()
	lim := limits.Rates{TPM: 60000}
	tenant := "flush" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if v, err := s.Admit(ctx, limits.Admission{Tenant: tenant, Rates: lim, Tokens: 5000}); err != nil || !v.Allowed {
		t.Fatalf("%+v %v", v, err)
	}
	before := redisMillis(t, client)
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	batch := []limits.Settlement{{Tenant: tenant, Rates: lim, TokenDelta: -1000}, {Tenant: tenant, Rates: lim, TokenDelta: -1000}}
	if err := s.SettleBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := s.AdmitAfter(ctx, []limits.Settlement{{Tenant: tenant, Rates: lim, TokenDelta: -1000}}, limits.Admission{Tenant: tenant, Rates: lim, Tokens: 0})
	if err != nil || !v.Allowed {
		t.Fatalf("%+v %v", v, err)
	}
	tat, err := client.Get(ctx, state.Keys{Prefix: prefix}.LimitCells(tenant)[1]).Float64()
	if err != nil {
		t.Fatal(err)
	}
	// 5000 reserved, three refunds of 1000: 2000 ms ahead of the admission (before is later).
	if got := tat - before; got > 2000+1 || got < 2000-(redisMillis(t, client)-before)-50 {
		t.Fatalf("cell %.1f ms ahead, want about 2000", got)
	}
}
