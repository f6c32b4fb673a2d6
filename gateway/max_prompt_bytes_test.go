package gateway_test

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// A tenant's max_prompt_bytes refuses a larger prompt with 413 in the route's envelope before
// any token is counted (no counting tier is reported) and before any engine sees it; a prompt
// within it is served.
func TestTenantMaxPromptBytes(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "max_prompt_bytes: 64", "", sim.URL)))
	before := sim.Stats(t).Requests["/v1/chat/completions"]
	long := strings.Repeat("a few words ", 10) // 120 bytes
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"`+long+`"}],"max_tokens":4}`)
	if r.status != 413 || !strings.Contains(string(r.body), "max_prompt_bytes") || r.header.Get("X-Kvgate-Tier") != "" {
		t.Fatalf("over max_prompt_bytes: %d %s (tier %q)", r.status, r.body, r.header.Get("X-Kvgate-Tier"))
	}
	r = post(t, gw.URL, "/v1/messages", tenantKey, `{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"`+long+`"}]}`)
	if r.status != 413 || !strings.Contains(string(r.body), `"type":"error"`) {
		t.Fatalf("messages over max_prompt_bytes: %d %s", r.status, r.body)
	}
	if n := sim.Stats(t).Requests["/v1/chat/completions"]; n != before {
		t.Fatalf("the engine got %d requests", n-before)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`); r.status != 200 {
		t.Fatalf("within max_prompt_bytes: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-bob", `{"model":"sim","messages":[{"role":"user","content":"`+long+`"}],"max_tokens":4}`); r.status != 200 {
		t.Fatalf("a tenant without the cap: %d %s", r.status, r.body)
	}
}
