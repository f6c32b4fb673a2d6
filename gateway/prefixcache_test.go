package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/testkit"
)

// saltEngine is an engine that records the prefix-cache salt of every generation body it gets:
// cache_salt on the OpenAI routes, extra_key on the native /generate ("" when absent).
func saltEngine(t *testing.T) (string, func() []string) {
	var mu sync.Mutex
	var seen []string
	url := fakeUnified(t, func(ctx *fasthttp.RequestCtx) {
		var f map[string]json.RawMessage
		_ = json.Unmarshal(ctx.PostBody(), &f)
		raw := f["cache_salt"]
		if string(ctx.Path()) == "/generate" {
			raw = f["extra_key"]
		}
		mu.Lock()
		seen = append(seen, strings.Trim(string(raw), `"`))
		mu.Unlock()
		ctx.SetContentType("application/json")
		if string(ctx.Path()) == "/generate" {
			ctx.SetBodyString(`{"text":"ok","meta_info":{"id":"x","prompt_tokens":3,"completion_tokens":1,"finish_reason":{"type":"stop"}}}`)
			return
		}
		ctx.SetBodyString(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	return url, func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
}

// Issue 15: /generate with input_ids and canary opt-out tenants carried no salt, so they shared
// the engine's prefix cache with everyone (a cached prefix answers faster: a timing channel).
// Every generation request now carries its tenant's salt, whatever the route, the prompt's form
// or the tenant's canary setting, and never another tenant's; policy.share_prefix_cache turns
// salting off.
func TestPrefixCacheSaltedForEveryTenantAndPromptForm(t *testing.T) {
	url, seen := saltEngine(t)
	yaml := func(extra string) string {
		return fmt.Sprintf(`backends: [{name: eng, url: %q, role: unified}]
tenants:
  - {name: alice, key_sha256: %q}
  - {name: carol, key_sha256: %q, canary_opt_out: true}
canary: {enabled: true, secret: salt-test-secret-padded-to-32-bytes}
capacity: {poll_interval: 100ms}
%s`, url, testkit.KeySHA256("alice-key"), testkit.KeySHA256("carol-key"), extra)
	}
	requests := []struct{ path, body string }{
		{"/generate", `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":1}}`},
		{"/generate", `{"input_ids":[[1,2,3],[4,5]],"sampling_params":{"max_new_tokens":1}}`},
		{"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":1}}`},
		{"/v1/completions", `{"model":"sim","prompt":[1,2,3],"max_tokens":1}`},
		{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`},
	}
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml("")))
	salts := map[string]string{}
	for _, key := range []string{"alice-key", "carol-key"} {
		for _, c := range requests {
			if r := post(t, gw.URL, c.path, key, c.body); r.status != 200 {
				t.Fatalf("%s %s %s: %d %s", key, c.path, c.body, r.status, r.body)
			}
			got := seen()
			if len(got) != 1 {
				t.Fatalf("%s %s: engine saw %d requests", key, c.path, len(got))
			}
			s := got[0]
			if strings.HasPrefix(s, "[") { // a batch: one salt per item, all the tenant's
				var items []string
				if err := json.Unmarshal([]byte(s), &items); err != nil || len(items) != 2 || items[0] != items[1] {
					t.Fatalf("%s %s: batch salts %s", key, c.path, s)
				}
				s = items[0]
			}
			if s == "" {
				t.Fatalf("%s %s %s reached the engine with no prefix-cache salt", key, c.path, c.body)
			}
			if prev, ok := salts[key]; ok && prev != s {
				t.Fatalf("%s: salt %q on %s, %q before: one tenant, one partition", key, s, c.path, prev)
			}
			salts[key] = s
		}
	}
	if salts["alice-key"] == salts["carol-key"] {
		t.Fatal("two tenants share a salt")
	}

	shared := testkit.StartGateway(t, testkit.ParseConfig(t, yaml("policy: {share_prefix_cache: true}\n")))
	for _, c := range requests {
		if r := post(t, shared.URL, c.path, "carol-key", c.body); r.status != 200 {
			t.Fatalf("shared %s: %d %s", c.path, r.status, r.body)
		}
		if got := seen(); len(got) != 1 || got[0] != "" {
			t.Fatalf("share_prefix_cache: %s carried salt %q", c.path, got)
		}
	}
}

// Token ids no vocabulary has (negative, or past 2^31−1) are refused with a 400 naming the field
// on every route that takes them, and never reach the engine.
func TestTokenIDsOutOfRangeRefused(t *testing.T) {
	url, seen := saltEngine(t)
	yaml := fmt.Sprintf(`backends: [{name: eng, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 100ms}
`, url, testkit.KeySHA256("alice-key"))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	for _, c := range []struct{ path, body, param string }{
		{"/generate", `{"input_ids":[1,-5,3],"sampling_params":{"max_new_tokens":1}}`, "input_ids"},
		{"/generate", `{"input_ids":[[1,2],[3,-1]],"sampling_params":{"max_new_tokens":1}}`, "input_ids[1]"},
		{"/generate", `{"input_ids":[1,2147483648],"sampling_params":{"max_new_tokens":1}}`, "input_ids"},
		{"/generate", `{"input_ids":[1,2],"sampling_params":{"max_new_tokens":1,"stop_token_ids":[-2]}}`, "sampling_params.stop_token_ids"},
		{"/v1/completions", `{"model":"sim","prompt":[1,-2,3],"max_tokens":1}`, "prompt"},
		{"/v1/completions", `{"model":"sim","prompt":[[1],[-2]],"max_tokens":1}`, "prompt[1]"},
		{"/v1/completions", `{"model":"sim","prompt":"hi","max_tokens":1,"stop_token_ids":[5,-1]}`, "stop_token_ids"},
		{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stop_token_ids":[-1]}`, "stop_token_ids"},
		{"/v1/embeddings", `{"model":"sim","input":[1,-3]}`, "input"},
	} {
		r := post(t, gw.URL, c.path, "alice-key", c.body)
		if r.status != 400 {
			t.Fatalf("%s %s: %d %s", c.path, c.body, r.status, r.body)
		}
		if e := decodeError(t, r); e.Error.Param == nil || *e.Error.Param != c.param || e.Error.Code != "invalid_request" {
			t.Fatalf("%s %s: want param %q, got %s", c.path, c.body, c.param, r.body)
		}
	}
	if got := seen(); len(got) != 0 {
		t.Fatalf("refused requests reached the engine: %d", len(got))
	}
	// In range: served.
	if r := post(t, gw.URL, "/generate", "alice-key", `{"input_ids":[0,2147483647],"sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("ids in range: %d %s", r.status, r.body)
	}
}
