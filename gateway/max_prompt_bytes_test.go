package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// max_prompt_bytes, end to end: a tenant's prompt over its cap (the prompt's fields as sent) is a
// 413 naming the prompt's field and the cap, before anything is counted (no X-Kvgate-Tier) and
// without reaching the engine; under it, 200. The same holds for a tenant added at run time
// through the admin API (its record is the file's).
func TestMaxPromptBytesFileAndRunTimeTenants(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "max_prompt_bytes: 200", "", sim.URL)))
	created := admin(t, "POST", gw.URL+"/admin/tenants", fmt.Sprintf(`{"name":"carol","key_sha256":%q,"max_prompt_bytes":200}`, testkit.KeySHA256("carol-key")))
	if created.status != 201 || !strings.Contains(string(created.body), `"max_prompt_bytes":200`) {
		t.Fatalf("create carol with max_prompt_bytes 200: %d %s", created.status, created.body)
	}
	long := strings.Repeat("words ", 40) // 240 bytes of text: the messages' JSON is over 200
	for _, c := range []struct{ key, path, tenant, body, short string }{
		{tenantKey, "/v1/chat/completions", "alice",
			`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":4}`, "hello"},
		{"carol-key", "/v1/messages", "carol",
			`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":4}`, "hello"},
		{"carol-key", "/v1/chat/completions", "carol",
			`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":4}`, "hello"},
	} {
		before := sim.Stats(t).Requests[c.path]
		r := post(t, gw.URL, c.path, c.key, fmt.Sprintf(c.body, long))
		if r.status != 413 || !strings.Contains(string(r.body), "max_prompt_bytes") || !strings.Contains(string(r.body), "200 prompt bytes") {
			t.Fatalf("%s %s over max_prompt_bytes: %d %s", c.tenant, c.path, r.status, r.body)
		}
		if c.path == "/v1/chat/completions" {
			if e := decodeError(t, r); e.Error.Code != "context_length_exceeded" || e.Error.Param == nil || *e.Error.Param != "messages" {
				t.Fatalf("%s: the 413 should name messages: %s", c.tenant, r.body)
			}
		} else {
			var e struct {
				Type  string                `json:"type"`
				Error struct{ Type string } `json:"error"`
			}
			if json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "request_too_large" {
				t.Fatalf("%s: want Anthropic's envelope: %s", c.path, r.body)
			}
		}
		if tier := r.header.Get("X-Kvgate-Tier"); tier != "" {
			t.Fatalf("%s: refused on bytes after a count (tier %q)", c.tenant, tier)
		}
		if n := sim.Stats(t).Requests[c.path]; n != before {
			t.Fatalf("%s: the engine got %d requests", c.tenant, n-before)
		}
		if r := post(t, gw.URL, c.path, c.key, fmt.Sprintf(c.body, c.short)); r.status != 200 {
			t.Fatalf("%s %s under max_prompt_bytes: %d %s", c.tenant, c.path, r.status, r.body)
		}
	}
	// bob has no cap: the long prompt passes.
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-bob", fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":4}`, long)); r.status != 200 {
		t.Fatalf("bob without a cap: %d %s", r.status, r.body)
	}
}
