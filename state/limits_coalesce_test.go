package state_test

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/redistest"
)

// opsFor is a random run of admissions, each after the settlements that queued before it, over
// four tenants: rpm alone, tpm alone (with oversized requests and owing ones), max_concurrent with settlements
// freeing slots (some twice, some never taken), and all three with limits that change between
// requests, carried usage, carry-only pushes and extra in-flight requests. The last items push a
// zero carry per tenant: they charge nothing and report how full the cells ended.
func opsFor(seed int64) []state.BatchItem {
	rng := rand.New(rand.NewSource(seed))
	tenants := []string{"r", "t", "c", "all"}
	var items []state.BatchItem
	var pending []limits.Settlement
	leases := map[string][]string{}
	limitsOf := func(tenant string) limits.Rates {
		switch tenant {
		case "r":
			return limits.Rates{RPM: 5}
		case "t":
			return limits.Rates{TPM: 100}
		case "c":
			return limits.Rates{MaxConcurrent: 3}
		}
		l := limits.Rates{RPM: 8, TPM: 100, MaxConcurrent: 4}
		if rng.Intn(4) == 0 {
			l.RPM = 0 // limits reloaded between requests
		}
		if rng.Intn(4) == 0 {
			l.TPM = 60
		}
		return l
	}
	for i := 0; i < 160; i++ {
		tenant := tenants[rng.Intn(len(tenants))]
		lim := limitsOf(tenant)
		if rng.Intn(3) == 0 && len(leases[tenant]) > 0 || rng.Intn(5) == 0 {
			s := limits.Settlement{Tenant: tenant, Rates: lim, TokenDelta: int64(rng.Intn(30) - 20)}
			if ls := leases[tenant]; len(ls) > 0 && rng.Intn(4) != 0 {
				s.Lease = ls[rng.Intn(len(ls))]
			}
			pending = append(pending, s)
			continue
		}
		a := limits.Admission{Tenant: tenant, Rates: lim, Tokens: int64(rng.Intn(25))}
		switch rng.Intn(15) {
		case 0:
			a.Tokens = 150 // more than a whole minute of tpm 100: never
		case 1, 2:
			// An unbounded output: up to twice the bucket, all but a small part owable (owing).
			a.Tokens = int64(60 + rng.Intn(150))
			a.Owable = a.Tokens - int64(rng.Intn(30))
		case 3:
			a.Tokens, a.Owable = 300, 100 // its part that must fit (200) exceeds the bucket: never
		}
		if lim.MaxConcurrent > 0 {
			a.Lease = fmt.Sprintf("L%d", i)
			leases[tenant] = append(leases[tenant], a.Lease)
			a.ExtraInflight = rng.Intn(2)
		}
		if rng.Intn(10) == 0 {
			a.CarryRPM, a.CarryTPM = float64(rng.Intn(3))*12000, float64(rng.Intn(30))*600
			a.CarryOnly = rng.Intn(2) == 0
		}
		items = append(items, state.BatchItem{Settle: pending, Admit: a})
		pending = nil
	}
	for _, tenant := range tenants {
		items = append(items, state.BatchItem{Settle: pending,
			Admit: limits.Admission{Tenant: tenant, Rates: limits.Rates{RPM: 5, TPM: 100}, CarryOnly: true}})
		pending = nil
	}
	return items
}

// sequential runs items one operation per call against s.
func sequential(t *testing.T, s interface {
	Admit(context.Context, limits.Admission) (limits.Verdict, error)
	Settle(context.Context, string, limits.Rates, int64, string) error
}, items []state.BatchItem) []limits.Verdict {
	t.Helper()
	ctx := context.Background()
	vs := make([]limits.Verdict, len(items))
	for i, it := range items {
		for _, st := range it.Settle {
			if err := s.Settle(ctx, st.Tenant, st.Rates, st.TokenDelta, st.Lease); err != nil {
				t.Fatal(err)
			}
		}
		v, err := s.Admit(ctx, it.Admit)
		if err != nil {
			t.Fatal(err)
		}
		vs[i] = v
	}
	return vs
}

// sameVerdicts compares b with a: the decision exactly, the times within tol (the runs read the
// clock at different instants; every charge is a multiple of 600 ms, so tol cannot flip one).
// setOnly compares a cell's fill only for a limit the admission sets (the memory store reports
// the fill of a cell it did not use as it last was, the scripts as empty; either is unused).
func sameVerdicts(t *testing.T, what string, items []state.BatchItem, a, b []limits.Verdict, tol float64, setOnly bool) {
	t.Helper()
	for i := range a {
		x, y := a[i], b[i]
		lim := items[i].Admit.Rates
		if x.Allowed != y.Allowed || x.Limit != y.Limit || x.Never != y.Never ||
			math.Abs(float64(x.RetryAfter-y.RetryAfter)/1e6) > tol+1 ||
			(!setOnly || lim.RPM > 0) && math.Abs(x.RPMFill-y.RPMFill) > tol ||
			(!setOnly || lim.TPM > 0) && math.Abs(x.TPMFill-y.TPMFill) > tol {
			t.Fatalf("%s: item %d (%+v after %d settlements) decided %+v, per request %+v", what, i, items[i].Admit, len(items[i].Settle), y, x)
		}
	}
}

// Issue 23: the admissions one pipeline carries (each after its settlements, grouped into one
// script call per tenant) are decided exactly as one script call per operation decided them (the
// scripts before issue 23, kept in export_test.go) and as the memory store decides them, and
// leave the same leases behind.
func TestBatchedScriptDecidesAsPerRequest(t *testing.T) {
	client, prefix := testRedis(t)
	ctx := context.Background()
	owed := 0
	for seed := int64(1); seed <= 6; seed++ {
		items := opsFor(seed)
		p := fmt.Sprintf("%s%d:", prefix, seed)
		ref := state.PerRequestStore{R: state.NewRedisLimits(client, p+"ref:")}
		start := time.Now()
		want := sequential(t, ref, items)
		tol := float64(time.Since(start).Milliseconds()) + 5
		mem := sequential(t, limits.NewMemory(), items)
		got, errs := state.NewRedisLimits(client, p+"bat:").AdmitBatchForTest(ctx, items)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("seed %d item %d: %v", seed, i, err)
			}
		}
		sameVerdicts(t, fmt.Sprintf("seed %d, memory store", seed), items, want, mem, tol, true)
		sameVerdicts(t, fmt.Sprintf("seed %d, batched script", seed), items, want, got, tol, false)
		allowed := 0
		for i, v := range got {
			if v.Allowed {
				allowed++
			}
			if v.Allowed && items[i].Admit.Owable > 0 && v.TPMFill > 60000 {
				owed++ // admitted into debt: the owing rule was exercised
			}
			if v.Never && v.RetryAfter != 0 {
				t.Fatalf("seed %d item %d: a request that never fits is told to retry: %+v", seed, i, v)
			}
		}
		if allowed == 0 || allowed == len(items)-4 {
			t.Fatalf("seed %d: %d of %d admitted: the run must both admit and refuse", seed, allowed, len(items))
		}
		for _, tenant := range []string{"c", "all"} {
			a := client.ZRange(ctx, state.Keys{Prefix: p + "ref:"}.LimitCells(tenant)[2], 0, -1).Val()
			b := client.ZRange(ctx, state.Keys{Prefix: p + "bat:"}.LimitCells(tenant)[2], 0, -1).Val()
			sort.Strings(a)
			sort.Strings(b)
			if strings.Join(a, ",") != strings.Join(b, ",") {
				t.Fatalf("seed %d tenant %s: leases left %v, per request %v", seed, tenant, b, a)
			}
		}
	}
	if owed == 0 {
		t.Fatal("no admission went into debt: owing untested")
	}
}

// Replicas sharing Redis, each coalescing its concurrent admissions: rpm and max_concurrent hold
// across them exactly, and the admissions do share round trips.
func TestCoalescedAdmissionsHoldAcrossReplicas(t *testing.T) {
	_, prefix := testRedis(t)
	const replicas, workers, tries = 3, 16, 40
	rt := &roundTrips{}
	stores := make([]*state.RedisLimits, replicas)
	for i := range stores {
		c := redistest.Client(t) // a connection of its own, as another process would have
		c.AddHook(rt)
		stores[i] = state.NewRedisLimits(c, prefix)
		warmScripts(t, limits.NewLimiter(stores[i], 1, 2*time.Second))
	}
	const rpm, maxc = 300, 7
	var admitted, inflight, peak, settled atomic.Int64
	var wg sync.WaitGroup
	rt.n.Store(0)
	start := time.Now()
	for r := range replicas {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for i := 0; i < tries; i++ {
					lease := fmt.Sprintf("%d-%d-%d", r, w, i)
					v, err := stores[r].Admit(ctx, limits.Admission{Tenant: "rate", Rates: limits.Rates{RPM: rpm}})
					if err != nil {
						t.Error(err)
						return
					}
					if v.Allowed {
						admitted.Add(1)
					}
					v, err = stores[r].Admit(ctx, limits.Admission{Tenant: "slots", Rates: limits.Rates{MaxConcurrent: maxc}, Lease: lease})
					if err != nil {
						t.Error(err)
						return
					}
					if v.Allowed {
						n := inflight.Add(1)
						for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
						}
						time.Sleep(100 * time.Microsecond)
						inflight.Add(-1) // before the slot is freed in Redis
						settled.Add(1)
						if err := stores[r].SettleBatch(ctx, []limits.Settlement{{Tenant: "slots", Rates: limits.Rates{MaxConcurrent: maxc}, Lease: lease}}); err != nil {
							t.Error(err)
							return
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	attempts := int64(replicas * workers * tries)
	// rpm 300 refills one request every 200 ms.
	refill := int64(elapsed/(200*time.Millisecond)) + 1
	if n := admitted.Load(); n < rpm || n > rpm+refill {
		t.Fatalf("%d of %d admitted at rpm %d across %d replicas in %v, want %d to %d", n, attempts, rpm, replicas, elapsed, rpm, rpm+refill)
	}
	if p := peak.Load(); p > maxc || p == 0 {
		t.Fatalf("%d requests in flight at once at max_concurrent %d", p, maxc)
	}
	trips := rt.n.Load()
	t.Logf("%d admissions and %d settlements over %d round trips in %v", 2*attempts, settled.Load(), trips, elapsed)
	if trips >= 2*attempts+settled.Load() { // each settlement here is a call of its own
		t.Fatalf("%d round trips for %d admissions and %d settlements: no admission shared one", trips, 2*attempts, settled.Load())
	}
}

// A tenant's script that fails (here WRONGTYPE: its cell is not a string) fails that tenant's
// queued checks and the checks that carried settlements to it; the other tenants' checks in
// the same pipeline are decided.
func TestBatchedErrorFailsOnlyItsTenant(t *testing.T) {
	client, prefix := testRedis(t)
	ctx := context.Background()
	if err := client.LPush(ctx, state.Keys{Prefix: prefix}.LimitCells("bad")[0], "x").Err(); err != nil {
		t.Fatal(err)
	}
	lim := limits.Rates{RPM: 10, TPM: 1000}
	items := []state.BatchItem{
		{Admit: limits.Admission{Tenant: "good", Rates: lim, Tokens: 5}},
		{Admit: limits.Admission{Tenant: "bad", Rates: lim, Tokens: 5}},
		{Settle: []limits.Settlement{{Tenant: "bad", Rates: lim, TokenDelta: -5}}, Admit: limits.Admission{Tenant: "good", Rates: lim, Tokens: 5}},
		{Admit: limits.Admission{Tenant: "good", Rates: lim, Tokens: 5}},
	}
	vs, errs := state.NewRedisLimits(client, prefix).AdmitBatchForTest(ctx, items)
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") || errs[2] == nil {
		t.Fatalf("the bad tenant's check and the check carrying its settlement: %v, %v", errs[1], errs[2])
	}
	if errs[0] != nil || errs[3] != nil || !vs[0].Allowed || !vs[3].Allowed {
		t.Fatalf("the good tenant's checks: %+v %v, %+v %v", vs[0], errs[0], vs[3], errs[3])
	}
}

// Redis stops answering while admissions are queued behind a pipeline: every one of them fails
// into degraded mode within the limiter's timeout, and together they hold the replica's share.
func TestCoalescedChecksFailIntoDegradedMode(t *testing.T) {
	cmd, client := privateRedis(t)
	l := limits.NewLimiter(state.NewRedisLimits(client, "p:"), 2, 50*time.Millisecond)
	warmScripts(t, l)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const n = 24
	var wg sync.WaitGroup
	var allowed, degraded atomic.Int64
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, v := l.Admit("a", limits.Rates{RPM: 20}, 1)
			if v.Allowed {
				allowed.Add(1)
			} else if v.Degraded && v.Share == 10 && v.Replicas == 2 {
				degraded.Add(1)
			}
		}()
	}
	wg.Wait()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the queued checks took %v with a 50 ms timeout", took)
	}
	if !l.Degraded() || allowed.Load() != 10 || degraded.Load() != n-10 {
		t.Fatalf("degraded=%v allowed=%d refused-by-share=%d of %d, want the share 20/2 = 10", l.Degraded(), allowed.Load(), degraded.Load(), n)
	}
}
