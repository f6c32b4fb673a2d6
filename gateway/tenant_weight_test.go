package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/testkit"
)

// A tenant added through the admin API with weight 4 is served by the admission queue at weight
// 4. Behind bob's request, which holds the pool, carol (run time, weight 4) and alice (the file,
// weight 1) wait with requests of the same size, queued in turn; each reply reports 4 tokens
// used, which the queue charges at the end. The fair queue then serves carol, alice, carol,
// carol, carol: carol's counter grows by a quarter of alice's per request. At weight 1 (what a
// run-time tenant got before issue 37) it alternates: carol, alice, carol, alice, carol.
func TestRunTimeTenantWeightReachesTheQueue(t *testing.T) {
	e := newQueueEngine(t, false)
	gw := queueGateway(t, e, "timeout: 1m")
	created := admin(t, "POST", gw.URL+"/admin/tenants", fmt.Sprintf(`{"name":"carol","key_sha256":%q,"weight":4}`, testkit.KeySHA256("carol-key")))
	if created.status != 201 || !strings.Contains(string(created.body), `"weight":4`) {
		t.Fatalf("create carol with weight 4: %d %s", created.status, created.body)
	}
	if r := admin(t, "GET", gw.URL+"/admin/tenants/carol", ""); r.status != 200 || !strings.Contains(string(r.body), `"weight":4`) {
		t.Fatalf("GET carol: %d %s", r.status, r.body)
	}
	done := make(chan reply, 8)
	send := func(key, prompt string) {
		// 5000 tokens of output each: two never fit the 8192-token pool together.
		body := fmt.Sprintf(`{"model":"sim","prompt":%q,"max_tokens":5000}`, prompt)
		go func() { done <- post(t, gw.URL, "/v1/completions", key, body) }()
	}
	send("bob-key", "bob 0")
	holder := <-e.held
	for i, s := range []struct{ key, prompt string }{
		{"carol-key", "carol 1"}, {"alice-key", "alice 1"}, {"carol-key", "carol 2"},
		{"alice-key", "alice 2"}, {"carol-key", "carol 3"}, {"carol-key", "carol 4"},
	} {
		send(s.key, s.prompt)
		eventually(t, 5*time.Second, s.prompt+" is queued", func() bool { return metric(t, gw.URL, "kvgate_queue_length") == float64(i+1) })
	}
	close(holder)
	var order []string
	for range 6 {
		release := <-e.held // one request at a time holds the pool
		e.mu.Lock()
		body := e.bodies[len(e.bodies)-1]
		e.mu.Unlock()
		for _, name := range []string{"alice", "carol"} {
			if strings.Contains(body, `"`+name+` `) {
				order = append(order, name)
			}
		}
		close(release) // its end frees the pool for the next
	}
	for range 7 {
		if r := <-done; r.status != 200 {
			t.Fatalf("a request failed: %d %s", r.status, r.body)
		}
	}
	if got, want := strings.Join(order, ","), "carol,alice,carol,carol,carol,alice"; got != want {
		t.Fatalf("the queue served %s; want %s (carol at weight 4, alice at 1)", got, want)
	}
}
