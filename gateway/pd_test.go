package gateway_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Two PD pairs with different pools behind one gateway, the leak bug on in every engine: the
// gateway must route each prompt to a pair that holds it and refuse the rest, so no engine ever
// sees a prompt its pool cannot hold (and the bug is never triggered).
func TestPDRoutingByCapacity(t *testing.T) {
	sims := map[string]*procs.Sim{}
	start := func(name, mode, pool string) {
		args := []string{"--mode", mode, "--pool-tokens", pool, "--context-length", "16384", "--bug", "admit-rejected", "--page-size", "16"}
		if mode == "prefill" {
			args = append(args, "--bootstrap-port", "0")
		}
		sims[name] = procs.StartSim(t, args...)
	}
	start("p-small", "prefill", "2048")
	start("d-small", "decode", "2048")
	start("p-large", "prefill", "8192")
	start("d-large", "decode", "8192")
	cfg := testkit.ParseConfig(t, gatewayYAML("",
		[3]string{"p-small", sims["p-small"].URL, "prefill"}, [3]string{"d-small", sims["d-small"].URL, "decode"},
		[3]string{"p-large", sims["p-large"].URL, "prefill"}, [3]string{"d-large", sims["d-large"].URL, "decode"}))
	gw := testkit.StartGateway(t, cfg)

	ids := func(n int) string { return strings.TrimSuffix(strings.Repeat("42,", n), ",") }
	// mril: small 2048−1−5 = 2042, large 8192−1−5 = 8186.
	large := sims["d-large"].Stats(t)
	r := post(t, gw.URL, "/generate", tenantKey, `{"input_ids":[`+ids(5000)+`],"sampling_params":{"max_new_tokens":4}}`)
	if r.status != 200 {
		t.Fatalf("5000 tokens fit only the large pair: want 200, got %d %s", r.status, r.body)
	}
	if _, ok := r.header["X-Sim-Foreign-Requests"]; ok {
		t.Fatalf("the simulator's ground-truth header reached the client: %v", r.header)
	}
	if got := sims["d-large"].Stats(t).Requests["/generate"]; got != large.Requests["/generate"]+1 {
		t.Fatalf("the large decode should have served it: %d → %d", large.Requests["/generate"], got)
	}
	if r := post(t, gw.URL, "/generate", tenantKey, `{"input_ids":[`+ids(9000)+`],"sampling_params":{"max_new_tokens":4}}`); r.status != 413 {
		t.Fatalf("9000 tokens fit no pair: want 413, got %d %s", r.status, r.body)
	}
	// Text prompts of many sizes, streaming and not, chat and native, one at a time (the
	// simulator, like an engine, queues what does not fit at once; sizes near the pool would
	// only wait for each other).
	rng := rand.New(rand.NewSource(7))
	statuses := map[int]int{}
	for i := 0; i < 16; i++ {
		n := 300 + rng.Intn(4500) // words of ~2–3 tokens: ~700 to ~13,000 tokens
		stream := i%2 == 0
		var path, body string
		if i%3 == 0 {
			path = "/v1/chat/completions"
			body = fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":3,"stream":%v}`, words(n), stream)
		} else {
			path = "/generate"
			body = fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":3},"stream":%v}`, words(n), stream)
		}
		r := post(t, gw.URL, path, tenantKey, body)
		statuses[r.status]++
		if r.status != 200 && r.status != 413 {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}

	}
	if statuses[200] == 0 || statuses[413] == 0 {
		t.Fatalf("the sizes should give both outcomes: %v", statuses)
	}
	// A concurrent burst of small prompts: every one needs its own bootstrap room, or decode
	// would pull another request's KV.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"text":"burst %d %s","sampling_params":{"max_new_tokens":2}}`, i, words(20+i)))
			if r.status != 200 {
				t.Errorf("burst %d: %d %s", i, r.status, r.body)
			}
		}(i)
	}
	wg.Wait()
	// Concurrent prompts that each fill most of a pool: the engines queue them, and every one
	// completes (no pool waits on the other).
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"input_ids":[%s],"sampling_params":{"max_new_tokens":2}}`, ids(5000+i)))
			if r.status != 200 {
				t.Errorf("big concurrent %d: %d %s", i, r.status, r.body)
			}
		}(i)
	}
	wg.Wait()
	for name, s := range sims {
		st := s.Stats(t)
		mril := 2042
		if strings.Contains(name, "large") {
			mril = 8186
		}
		if st.MaxPromptTokens >= mril {
			t.Errorf("%s received a %d-token prompt; its max_req_input_len is %d", name, st.MaxPromptTokens, mril)
		}
		if len(st.Rejected) != 0 {
			t.Errorf("%s rejected requests the gateway admitted: %v", name, st.Rejected)
		}
		if st.ForeignReplies != 0 {
			t.Errorf("%s answered %d admitted requests from other requests' stale pages", name, st.ForeignReplies)
		}
	}
	t.Logf("statuses %v", statuses)

	// The admin view shows both roles as reported.
	a := get(t, gw.URL+"/admin/backends", "admin-key")
	var adm struct {
		Backends []struct {
			Name         string `json:"name"`
			ReportedMode string `json:"reported_disaggregation_mode"`
			RoleMatches  bool   `json:"role_matches"`
			Usable       bool   `json:"usable"`
		} `json:"backends"`
	}
	if a.status != 200 || json.Unmarshal(a.body, &adm) != nil || len(adm.Backends) != 4 {
		t.Fatalf("admin backends: %d %s", a.status, a.body)
	}
	for _, b := range adm.Backends {
		if !b.RoleMatches || !b.Usable || !strings.HasPrefix(b.Name, b.ReportedMode[:1]) {
			t.Fatalf("admin view wrong for %+v", b)
		}
	}
}

// A backend whose reported role differs from its configured one leaves the pool.
func TestRoleMismatchTakesBackendOut(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "4096", "--context-length", "8192")
	cfg := testkit.ParseConfig(t, gatewayYAML("", [3]string{"wrong", sim.URL, "unified"}))
	gw := testkit.StartGateway(t, cfg)
	r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hello","sampling_params":{"max_new_tokens":1}}`)
	if r.status != 503 || decodeError(t, r).Error.Code != "no_backend" {
		t.Fatalf("want 503 no_backend, got %d %s", r.status, r.body)
	}
	if sim.Stats(t).Requests["/generate"] != 0 {
		t.Fatal("a misconfigured backend received traffic")
	}
}
