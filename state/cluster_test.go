package state_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/redistest"
)

// Every store on a real 3-master Redis Cluster (two clients, as two replicas): the control-plane
// writes that change several keys at once (a quarantine flag and its set, a tenant with its key
// index and version) run in one slot and hold their invariants; the limit cells of each tenant
// are one script on the tenant's own slot.
func TestStoresOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	open := func() redis.UniversalClient {
		c, err := state.NewClient(cl.URL, state.ModeCluster)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := open(), open()
	const prefix = "kvgcl:"
	ctx := context.Background()

	testQuarantine(t, state.NewRedisQuarantine(a, prefix), state.NewRedisQuarantine(b, prefix))

	inc := state.NewRedisIncidents(a, prefix, 100, 10)
	for i := 1; i <= 3; i++ {
		if err := inc.Record(ctx, incident(i)); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := state.NewRedisIncidents(b, prefix, 100, 10).List(ctx, 2); err != nil || ids(got) != "req-3,req-2" {
		t.Fatalf("incidents from the other replica: %v %v", ids(got), err)
	}

	ta, tb := state.NewRedisTenants(a, prefix), state.NewRedisTenants(b, prefix)
	key := func(c byte) string {
		s := make([]byte, 64)
		for i := range s {
			s[i] = c
		}
		return string(s)
	}
	if err := ta.Create(ctx, config.Tenant{Name: "acme", KeySHA256: key('a'), RPM: 7}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Create(ctx, config.Tenant{Name: "other", KeySHA256: key('a')}); !errors.Is(err, state.ErrKeyInUse) {
		t.Fatalf("a second tenant with acme's key: %v, want ErrKeyInUse", err)
	}
	if err := tb.Update(ctx, config.Tenant{Name: "acme", KeySHA256: key('b'), RPM: 9}); err != nil {
		t.Fatal(err)
	}
	// acme's old key was freed with the update: another tenant may take it.
	if err := ta.Create(ctx, config.Tenant{Name: "other", KeySHA256: key('a')}); err != nil {
		t.Fatal(err)
	}
	if r, err := ta.Get(ctx, "acme"); err != nil || r.RPM != 9 || r.KeySHA256 != key('b') {
		t.Fatalf("acme after the update: %+v %v", r, err)
	}
	if v, err := tb.Version(ctx); err != nil || v != 3 {
		t.Fatalf("tenant version %d %v, want 3 writes", v, err)
	}
	if err := tb.Delete(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if list, err := ta.List(ctx); err != nil || len(list) != 1 || list[0].Name != "acme" {
		t.Fatalf("tenants after delete: %+v %v", list, err)
	}

	la, lb := state.NewRedisLimits(a, prefix), state.NewRedisLimits(b, prefix)
	for _, tenant := range []string{"acme", "globex", "initech"} {
		adm := limits.Admission{Tenant: tenant, Rates: limits.Rates{RPM: 3, TPM: 1000, MaxConcurrent: 10}, Tokens: 10}
		allowed := 0
		for i := 0; i < 6; i++ {
			s := limits.Store(la)
			if i%2 == 1 {
				s = lb
			}
			adm.Lease = tenant + string(rune('a'+i))
			v, err := s.Admit(ctx, adm)
			if err != nil {
				t.Fatalf("%s: admit on the cluster: %v", tenant, err)
			}
			if v.Allowed {
				allowed++
			}
		}
		if allowed != 3 {
			t.Fatalf("%s: %d of 6 admitted at rpm 3", tenant, allowed)
		}
	}
	// One pipeline of admissions over tenants on different slots (and masters), settlements
	// carried to other tenants' cells: one script call per tenant, each on its own node.
	lim := limits.Rates{RPM: 2, MaxConcurrent: 5}
	var items []state.BatchItem
	for i := 0; i < 3; i++ {
		for _, tenant := range []string{"umbrella", "hooli", "wayne", "stark"} {
			it := state.BatchItem{Admit: limits.Admission{Tenant: tenant, Rates: lim, Lease: tenant + string(rune('0'+i))}}
			if i == 1 {
				it.Settle = []limits.Settlement{{Tenant: "acme", Rates: limits.Rates{MaxConcurrent: 10}, Lease: "acme" + string(rune('a'+i))}}
			}
			items = append(items, it)
		}
	}
	vs, errs := la.AdmitBatchForTest(ctx, items)
	for i, v := range vs {
		if errs[i] != nil {
			t.Fatalf("batched admission %d on the cluster: %v", i, errs[i])
		}
		if want := i < 8; v.Allowed != want {
			t.Fatalf("batched admission %d (%s) on the cluster: %+v, want allowed %v at rpm 2", i, items[i].Admit.Tenant, v, want)
		}
	}
	if n := a.ZCard(ctx, state.Keys{Prefix: prefix}.LimitCells("acme")[2]).Val(); n != 2 {
		t.Fatalf("acme holds %d leases after the batch freed one of 3, want 2", n)
	}
}
