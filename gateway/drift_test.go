package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// driftYAML: one tenant, the admin key, the given model-named backends (name=url=model), shared
// Redis state under prefix ("" for memory).
func driftYAML(redisURL, prefix string, backends ...[3]string) string {
	var b strings.Builder
	b.WriteString("backends:\n")
	models := map[string]bool{}
	var names []string
	for _, be := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: unified, model: %s}\n", be[0], be[1], be[2])
		if !models[be[2]] {
			models[be[2]] = true
			names = append(names, be[2])
		}
	}
	b.WriteString("models:\n")
	for _, m := range names {
		fmt.Fprintf(&b, "  - {name: %s}\n", m)
	}
	fmt.Fprintf(&b, "tenants:\n  - {name: alice, key_sha256: %q}\n", testkit.KeySHA256(tenantKey))
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	b.WriteString("capacity: {poll_interval: 200ms}\n")
	if redisURL != "" {
		fmt.Fprintf(&b, "state: {redis_url: %q, key_prefix: %q}\n", redisURL, prefix)
	}
	return b.String()
}

type driftIncident struct {
	Kind           string `json:"kind"`
	RequestID      string `json:"request_id"`
	Requester      string `json:"requester"`
	Model          string `json:"model"`
	Route          string `json:"route"`
	EngineTokens   int    `json:"engine_tokens"`
	AdmittedTokens int    `json:"admitted_tokens"`
}

func incidentsOf(t *testing.T, url, kind string) ([]driftIncident, string) {
	t.Helper()
	r := get(t, url+"/admin/incidents?limit=10000", "admin-key")
	if r.status != 200 {
		t.Fatalf("incidents: %d %s", r.status, r.body)
	}
	var list struct{ Incidents []driftIncident }
	if err := json.Unmarshal(r.body, &list); err != nil {
		t.Fatal(err)
	}
	var out []driftIncident
	for _, i := range list.Incidents {
		if i.Kind == kind {
			out = append(out, i)
		}
	}
	return out, string(r.body)
}

func failClosedModels(t *testing.T, url string) []string {
	t.Helper()
	r := get(t, url+"/admin/models/fail-closed", "admin-key")
	if r.status != 200 {
		t.Fatalf("fail-closed list: %d %s", r.status, r.body)
	}
	var list struct {
		FailClosed []struct{ Model string } `json:"fail_closed"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list.FailClosed {
		names = append(names, m.Model)
	}
	return names
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTemplateDriftFailsClosed: an engine whose template renders tokens the gateway does not
// model (the simulator's --bug template-drift) reports more prompt tokens than admission's bound.
// Each such reply raises kvgate_count_drift_total and is a count_drift incident (ids and counts,
// no prompt text); within 10 requests the model's admission is fail-closed on every replica
// sharing the state store (503 with Retry-After for a prompt without an exact count; token ids
// still pass), until an operator clears it on the admin API of any replica.
func TestTemplateDriftFailsClosed(t *testing.T) {
	sim := procs.StartSim(t, "--bug", "template-drift", "--model", "drifty")
	yaml := driftYAML(testRedisURL(), uniquePrefix(t), [3]string{"sim", sim.URL, "drifty"})
	a := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	b := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))

	const secret = "my private prompt text"
	body := `{"model":"drifty","messages":[{"role":"user","content":"` + secret + `"}],"max_tokens":2}`
	closedAt := 0
	for i := 1; i <= 10; i++ {
		r := post(t, a.URL, "/v1/chat/completions", tenantKey, body)
		if r.status == 503 {
			e := decodeError(t, r)
			if e.Error.Code != "count_unavailable" || !strings.Contains(e.Error.Message, "fail-closed") || r.header.Get("Retry-After") == "" {
				t.Fatalf("fail-closed refusal: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
			}
			closedAt = i
			break
		}
		if r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if closedAt == 0 {
		t.Fatal("10 drifting replies did not make the model fail-closed")
	}
	t.Logf("fail-closed at request %d", closedAt)
	if n := metric(t, a.URL, "kvgate_count_drift_total", `model="drifty"`, `route="/v1/chat/completions"`); n < 1 {
		t.Fatalf("kvgate_count_drift_total = %v", n)
	}
	if n := metric(t, a.URL, "kvgate_count_drift_tokens_count", `model="drifty"`); n < 1 {
		t.Fatalf("kvgate_count_drift_tokens has no observation: %v", n)
	}
	var incs []driftIncident
	var raw string
	waitUntil(t, "count_drift incidents recorded", func() bool {
		incs, raw = incidentsOf(t, a.URL, "count_drift")
		return len(incs) >= closedAt-1
	})
	for _, inc := range incs {
		if inc.Model != "drifty" || inc.Route != "/v1/chat/completions" || inc.Requester != "alice" || inc.RequestID == "" ||
			inc.EngineTokens <= inc.AdmittedTokens || inc.AdmittedTokens <= 0 {
			t.Errorf("incident %+v", inc)
		}
	}
	if strings.Contains(raw, secret) {
		t.Fatal("an incident holds prompt text")
	}

	// Every replica sees the flag through the shared store.
	waitUntil(t, "the other replica sees the model fail-closed", func() bool {
		return strings.Join(failClosedModels(t, b.URL), ",") == "drifty"
	})
	if r := post(t, b.URL, "/v1/chat/completions", tenantKey, body); r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("the other replica admitted a prompt without an exact count: %d %s", r.status, r.body)
	}
	// In the route's own envelope: Anthropic's on /v1/messages.
	if r := post(t, b.URL, "/v1/messages", tenantKey, `{"model":"drifty","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); r.status != 503 ||
		r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), `"type":"error"`) {
		t.Fatalf("/v1/messages while fail-closed: %d %s", r.status, r.body)
	}
	// Token ids are an exact count: still admitted.
	if r := post(t, a.URL, "/generate", tenantKey, `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
		t.Fatalf("token ids while fail-closed: %d %s", r.status, r.body)
	}
	// The admin API: clearing a model that is not fail-closed is a 404; clearing this one (on
	// the other replica) reopens admission everywhere.
	if r := post(t, b.URL, "/admin/models/other/clear-fail-closed", "admin-key", ""); r.status != 404 {
		t.Fatalf("clearing a model that is not fail-closed: %d %s", r.status, r.body)
	}
	if r := post(t, b.URL, "/admin/models/drifty/clear-fail-closed", tenantKey, ""); r.status != 401 {
		t.Fatalf("a tenant key cleared the flag: %d", r.status)
	}
	if r := post(t, b.URL, "/admin/models/drifty/clear-fail-closed", "admin-key", ""); r.status != 200 {
		t.Fatalf("clear: %d %s", r.status, r.body)
	}
	waitUntil(t, "the replica that tripped sees the clear", func() bool { return len(failClosedModels(t, a.URL)) == 0 })
	if r := post(t, a.URL, "/v1/chat/completions", tenantKey, body); r.status != 200 {
		t.Fatalf("after the clear: %d %s", r.status, r.body)
	}
}

// TestOrdinaryTrafficHasNoDrift: 1,000 ordinary requests over three models, every generation
// route, streamed and whole, give no count drift: each reply's engine count is within the bound
// admission used (the histogram saw them all), no count_drift incident, no model fail-closed.
func TestOrdinaryTrafficHasNoDrift(t *testing.T) {
	var backends [][3]string
	for _, m := range []string{"alpha", "beta", "gamma"} {
		sim := procs.StartSim(t, "--model", m, "--pool-tokens", "65536", "--context-length", "32768")
		backends = append(backends, [3]string{"sim-" + m, sim.URL, m})
	}
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, driftYAML("", "", backends...)))

	bodies := func(i int, model string) (string, string) {
		stream := "false"
		if i%3 == 0 {
			stream = "true"
		}
		text := strings.Repeat(fmt.Sprintf("word %d, ", i), 1+i%40)
		switch i % 5 {
		case 0:
			return "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":%q}],"max_tokens":2,"stream":%s}`, model, text, stream)
		case 1:
			return "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2,"stream":%s}`, model, text, stream)
		case 2:
			return "/v1/responses", fmt.Sprintf(`{"model":%q,"instructions":"Be brief.","input":%q,"max_output_tokens":2}`, model, text)
		case 3:
			return "/v1/messages", fmt.Sprintf(`{"model":%q,"system":"Be brief.","messages":[{"role":"user","content":%q}],"max_tokens":2}`, model, text)
		}
		return "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":[{"type":"text","text":%q}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"max_tokens":2}`, model, text)
	}
	const total, workers = 1000, 4
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan string, total)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				model := []string{"alpha", "beta", "gamma"}[i%3]
				path, body := bodies(i, model)
				if r := post(t, gw.URL, path, tenantKey, body); r.status != 200 {
					errs <- fmt.Sprintf("%s %d: %d %.200s", path, i, r.status, r.body)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := metric(t, gw.URL, "kvgate_count_drift_tokens_count"); n < total {
		t.Errorf("the drift histogram saw %v replies of %d: some reply's engine count was not compared", n, total)
	}
	if n := metric(t, gw.URL, "kvgate_count_drift_total"); n != 0 {
		t.Errorf("kvgate_count_drift_total = %v on ordinary traffic", n)
	}
	if incs, _ := incidentsOf(t, gw.URL, "count_drift"); len(incs) != 0 {
		t.Errorf("%d count_drift incidents on ordinary traffic: %+v", len(incs), incs[0])
	}
	if m := failClosedModels(t, gw.URL); len(m) != 0 {
		t.Errorf("fail-closed on ordinary traffic: %v", m)
	}
}
