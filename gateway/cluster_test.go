package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/redistest"
	"github.com/kvgate/kvgate/tests/testkit"
)

// A real 3-master Redis Cluster on loopback behind two gateway replicas: six tenants, each with
// rpm 4, send 8 requests each, alternating replicas, all at once. Every tenant gets exactly 4
// (the cell refills one request per 15 s; the test asserts it ran well within that), the engine
// sees exactly those, and each tenant's cells sit in one slot, on the master that owns the slot,
// with the tenants spread over all three masters.
func TestRedisClusterLimitsPerTenantSlot(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	const prefix, tenantsN, rpm, each = "kvgcl:", 6, 4, 8
	var y strings.Builder
	fmt.Fprintf(&y, "backends:\n  - {name: sim, url: %q, role: unified}\ntenants:\n", sim.URL)
	for i := 0; i < tenantsN; i++ {
		fmt.Fprintf(&y, "  - {name: team-%d, key_sha256: %q, rpm: %d, tpm: 1000000, max_concurrent: 50}\n", i, testkit.KeySHA256(fmt.Sprintf("sk-team-%d", i)), rpm)
	}
	fmt.Fprintf(&y, "capacity: {poll_interval: 200ms}\nstate: {redis_url: %q, redis_mode: cluster, key_prefix: %q}\nlimits: {redis_timeout: 1s}\n", cl.URL, prefix)
	gws := twoReplicas(t, y.String())
	before := sim.Stats(t).Requests["/v1/chat/completions"]

	start := time.Now()
	codes := make([]map[int]int, tenantsN)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < tenantsN; i++ {
		codes[i] = map[int]int{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < each; j++ {
				r := post(t, gws[j%2].URL, "/v1/chat/completions", fmt.Sprintf("sk-team-%d", i), smallChat)
				if r.status == 429 {
					checkRateLimited(t, r, "requests")
				}
				mu.Lock()
				codes[i][r.status]++
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if elapsed := time.Since(start); elapsed > 14*time.Second {
		t.Fatalf("the burst took %s: a cell refills one request per 15 s, so exact counts need it shorter", elapsed)
	}
	for i, c := range codes {
		if c[200] != rpm || c[429] != each-rpm {
			t.Fatalf("team-%d: %v, want exactly %d admitted and %d refused over two replicas", i, c, rpm, each-rpm)
		}
	}
	if got := sim.Stats(t).Requests["/v1/chat/completions"] - before; got != tenantsN*rpm {
		t.Fatalf("the engine saw %d requests, want %d", got, tenantsN*rpm)
	}

	// Where the cells are: CLUSTER KEYSLOT of each tenant's keys, and which master answers for it.
	ctx := context.Background()
	node0 := cl.Node(0)
	defer node0.Close()
	slots := map[int64]bool{}
	holders := map[string]bool{}
	for i := 0; i < tenantsN; i++ {
		keys := state.Keys{Prefix: prefix}.LimitCells(fmt.Sprintf("team-%d", i))
		var slot int64 = -1
		for _, k := range keys {
			s, err := node0.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slot >= 0 && s != slot {
				t.Fatalf("team-%d: %s is in slot %d, its other cells in %d", i, k, s, slot)
			}
			slot = s
		}
		slots[slot] = true
		// The request cell exists (full for a minute after 4 requests at rpm 4; the token cell may
		// already have expired, a few tokens of a million), on exactly one master.
		var on []string
		for n := range cl.Addrs {
			c := cl.Node(n)
			exists, err := c.Exists(ctx, keys[0]).Result()
			c.Close()
			if err == nil && exists == 1 {
				on = append(on, cl.Addrs[n])
			}
		}
		if len(on) != 1 {
			t.Fatalf("team-%d: cell %s found on %v, want exactly one master", i, keys[0], on)
		}
		holders[on[0]] = true
	}
	if len(slots) != tenantsN || len(holders) != 3 {
		t.Fatalf("tenants' cells in %d slots on %d masters, want %d slots over all 3", len(slots), len(holders), tenantsN)
	}
	// The control-plane keys work on the cluster too: every replica's heartbeat is in one set.
	cc, err := state.NewClient(cl.URL, state.ModeCluster)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	eventually(t, 5*time.Second, "both replicas' heartbeats in the cluster", func() bool {
		n, _ := cc.ZCard(ctx, state.Keys{Prefix: prefix}.Replicas()).Result()
		return n == 2
	})
}
