package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Every route of the inference API through a real simulator: a normal request is served in the
// route's shape, an oversized one is refused before the simulator counts it, the engine's
// admin surface is unreachable, and each tenant's requests carry its own cache salt.

func routesYAML(extra string, backends ...[3]string) string {
	var b strings.Builder
	b.WriteString("backends:\n")
	for _, be := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: %s}\n", be[0], be[1], be[2])
	}
	fmt.Fprintf(&b, "tenants:\n  - {name: alice, key_sha256: %q}\n  - {name: bob, key_sha256: %q}\n", testkit.KeySHA256(tenantKey), testkit.KeySHA256("sk-bob"))
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	b.WriteString("capacity: {poll_interval: 200ms}\ncanary: {enabled: true, secret: routes-test-secret-padded-to-32-bytes}\n")
	b.WriteString(extra)
	return b.String()
}

// postH posts with extra headers (no Authorization unless given).
func postH(t testing.TB, url, body string, h map[string]string) reply {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func TestEveryRouteAdmitsAndServes(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, routesYAML("", [3]string{"sim", sim.URL, "unified"})))
	big := words(6000) // far over the 4,090-token max_req_input_len, under the 8,192 context
	small := "what is the capital of France"
	type route struct {
		path, normal, oversized, want string // want: a field the normal reply must have
	}
	routes := []route{
		{"/v1/responses", `{"model":"sim","instructions":"Be brief.","input":"` + small + `","max_output_tokens":4}`,
			`{"model":"sim","input":[{"role":"user","content":[{"type":"input_text","text":"` + big + `"}]}],"max_output_tokens":4}`, "output"},
		{"/v1/messages", `{"model":"sim","system":"Be brief.","messages":[{"role":"user","content":"` + small + `"}],"max_tokens":4}`,
			`{"model":"sim","messages":[{"role":"user","content":[{"type":"text","text":"` + big + `"}]}],"max_tokens":4}`, "content"},
		{"/v1/embeddings", `{"model":"sim","input":["` + small + `","another"]}`, `{"model":"sim","input":["short","` + big + `"]}`, "data"},
		{"/v1/rerank", `{"model":"sim","query":"capital","documents":["Paris","Berlin"]}`,
			`{"model":"sim","query":"capital","documents":["Paris","` + big + `"]}`, ""},
		{"/v1/score", `{"model":"sim","query":"capital","items":["Paris","Berlin"]}`, `{"model":"sim","query":"` + big + `","items":["Paris"]}`, "scores"},
		{"/v1/classify", `{"model":"sim","input":"` + small + `"}`, `{"model":"sim","input":"` + big + `"}`, "data"},
		{"/encode", `{"text":"` + small + `"}`, `{"text":"` + big + `"}`, "embedding"},
		{"/classify", `{"text":"` + small + `"}`, `{"text":"` + big + `"}`, "embedding"},
	}
	for _, rt := range routes {
		t.Run(strings.Trim(rt.path, "/"), func(t *testing.T) {
			before := sim.Stats(t).Requests[rt.path]
			r := post(t, gw.URL, rt.path, tenantKey, rt.normal)
			if r.status != 200 {
				t.Fatalf("normal request: %d %s", r.status, r.body)
			}
			var v any
			if err := json.Unmarshal(r.body, &v); err != nil {
				t.Fatalf("reply is not JSON: %s", r.body)
			}
			if m, ok := v.(map[string]any); rt.want != "" && (!ok || m[rt.want] == nil) {
				t.Fatalf("reply lacks %q: %s", rt.want, r.body)
			}
			if bytes.Contains(r.body, []byte("KVG-")) {
				t.Fatalf("marker bytes in a reply: %s", r.body)
			}
			if got := sim.Stats(t).Requests[rt.path]; got != before+1 {
				t.Fatalf("the simulator counted %d → %d requests", before, got)
			}
			r = post(t, gw.URL, rt.path, tenantKey, rt.oversized)
			if r.status != 413 {
				t.Fatalf("oversized: want 413, got %d %s", r.status, r.body)
			}
			if rt.path == "/v1/messages" {
				var e struct {
					Type  string
					Error struct{ Type, Message string }
				}
				if json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "request_too_large" || e.Error.Message == "" {
					t.Fatalf("Anthropic's envelope expected: %s", r.body)
				}
			} else if e := decodeError(t, r); e.Error.Code != "context_length_exceeded" {
				t.Fatalf("413 body: %s", r.body)
			}
			if got := sim.Stats(t).Requests[rt.path]; got != before+1 {
				t.Fatalf("the oversized request reached the simulator (%d → %d)", before, got)
			}
		})
	}

	t.Run("streams of the Responses and Messages APIs", func(t *testing.T) {
		for _, c := range []struct{ path, body, event string }{
			{"/v1/responses", `{"model":"sim","input":"` + small + `","max_output_tokens":6,"stream":true}`, "response.output_text.delta"},
			{"/v1/messages", `{"model":"sim","messages":[{"role":"user","content":"` + small + `"}],"max_tokens":6,"stream":true}`, "content_block_delta"},
		} {
			r := post(t, gw.URL, c.path, tenantKey, c.body)
			if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") ||
				!bytes.Contains(r.body, []byte("event: "+c.event+"\n")) || bytes.Contains(r.body, []byte("KVG-")) {
				t.Fatalf("%s: %d %v %s", c.path, r.status, r.header, r.body)
			}
		}
	})

	t.Run("Anthropic's SDK sends x-api-key and reads its envelope", func(t *testing.T) {
		body := `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
		r := postH(t, gw.URL+"/v1/messages", body, map[string]string{"x-api-key": tenantKey, "anthropic-version": "2023-06-01"})
		if r.status != 200 {
			t.Fatalf("x-api-key: %d %s", r.status, r.body)
		}
		r = postH(t, gw.URL+"/v1/messages", body, map[string]string{"x-api-key": "wrong"})
		var e struct {
			Type  string
			Error struct{ Type string }
		}
		if r.status != 401 || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "authentication_error" {
			t.Fatalf("bad key: %d %s", r.status, r.body)
		}
		r = post(t, gw.URL, "/v1/messages", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hi"}]}`)
		if r.status != 400 || !bytes.Contains(r.body, []byte(`"invalid_request_error"`)) || !bytes.Contains(r.body, []byte("max_tokens")) {
			t.Fatalf("missing max_tokens: %d %s", r.status, r.body)
		}
	})

	t.Run("stored context is refused", func(t *testing.T) {
		r := post(t, gw.URL, "/v1/responses", tenantKey, `{"model":"sim","input":"more","previous_response_id":"resp_1"}`)
		if e := decodeError(t, r); r.status != 400 || e.Error.Param == nil || *e.Error.Param != "previous_response_id" {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})

	t.Run("utility routes pass with the tenant's auth", func(t *testing.T) {
		r := post(t, gw.URL, "/v1/tokenize", tenantKey, `{"model":"sim","prompt":"hello world"}`)
		var tok struct {
			Tokens []int `json:"tokens"`
			Count  int   `json:"count"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &tok) != nil || tok.Count == 0 || len(tok.Tokens) != tok.Count {
			t.Fatalf("tokenize: %d %s", r.status, r.body)
		}
		ids, _ := json.Marshal(tok.Tokens)
		r = post(t, gw.URL, "/v1/detokenize", tenantKey, `{"model":"sim","tokens":`+string(ids)+`}`)
		if r.status != 200 || !bytes.Contains(r.body, []byte("hello world")) {
			t.Fatalf("detokenize: %d %s", r.status, r.body)
		}
		if r := post(t, gw.URL, "/v1/tokenize", "", `{"prompt":"x"}`); r.status != 401 {
			t.Fatalf("tokenize without a key: %d", r.status)
		}
		if r := post(t, gw.URL, "/v1/tokenize", tenantKey, `{"prompt":"x","rid":"steal"}`); r.status != 400 {
			t.Fatalf("unknown tokenize field: %d %s", r.status, r.body)
		}
		r = postH(t, gw.URL+"/v1/messages/count_tokens", `{"model":"sim","messages":[{"role":"user","content":"hello"}]}`, map[string]string{"x-api-key": tenantKey})
		if r.status != 200 || !bytes.Contains(r.body, []byte(`"input_tokens"`)) {
			t.Fatalf("count_tokens: %d %s", r.status, r.body)
		}
	})

	t.Run("the engine's admin surface is unreachable", func(t *testing.T) {
		before := sim.Stats(t).Requests
		for _, p := range []string{"/flush_cache", "/update_weights_from_disk", "/start_profile", "/stop_profile", "/abort_request", "/server_info", "/get_server_info"} {
			r := post(t, gw.URL, p, tenantKey, `{"rid":"x","abort_all":true}`)
			if r.status != 404 || decodeError(t, r).Error.Code != "not_found" {
				t.Fatalf("%s: %d %s", p, r.status, r.body)
			}
		}
		after := sim.Stats(t).Requests
		for _, p := range []string{"/flush_cache", "/update_weights_from_disk", "/start_profile", "/stop_profile"} {
			if after[p] != before[p] {
				t.Fatalf("%s reached the simulator", p)
			}
		}
	})

	t.Run("each tenant gets its own cache salt, whatever it sends", func(t *testing.T) {
		for _, key := range []string{tenantKey, "sk-bob", tenantKey} {
			r := post(t, gw.URL, "/v1/chat/completions", key, `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"cache_salt":"shared-by-everyone"}`)
			if r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
		}
		// Every request the simulator saw came through the gateway: two tenants, two salts (the
		// client's own would be a third).
		if got := sim.Stats(t).CacheSalts; got != 2 {
			t.Fatalf("want 2 distinct salts (one per tenant, the client's replaced), got %d", got)
		}
	})
}

// On a leaking PD pair (admission relaxed by monitor mode), the Responses and Messages APIs'
// replies that quote other tenants' stale pages are cut, streaming and not, in each route's
// envelope, and the client sees no marker.
func TestGenerationRoutesCutLeaks(t *testing.T) {
	common := []string{"--context-length", "16384", "--bug", "admit-rejected", "--page-size", "16", "--seed", "5"}
	prefill := procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "4096", "--bootstrap-port", "0"}, common...)...)
	decode := procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "16384"}, common...)...)
	yaml := canaryYAML(uniquePrefix(t), "monitor", [3]string{"p0", prefill.URL, "prefill"}, [3]string{"d0", decode.URL, "decode"})
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	oversized := strings.Repeat("tell me more ", 1800) // past prefill's 4,090, under the context
	for _, c := range []struct {
		path   string
		stream bool
		body   string
	}{
		{"/v1/responses", false, `{"model":"sim","input":"` + oversized + `","max_output_tokens":600}`},
		{"/v1/responses", true, `{"model":"sim","input":"` + oversized + `","max_output_tokens":600,"stream":true}`},
		{"/v1/messages", false, `{"model":"sim","messages":[{"role":"user","content":"` + oversized + `"}],"max_tokens":600}`},
		{"/v1/messages", true, `{"model":"sim","messages":[{"role":"user","content":"` + oversized + `"}],"max_tokens":600,"stream":true}`},
	} {
		name := fmt.Sprintf("%s stream=%v", c.path, c.stream)
		for i, tenant := range []string{"a", "b", "c", "d", "e"} {
			body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"system","content":"You are tenant %s's assistant."},{"role":"user","content":%q}],"max_tokens":4}`,
				tenant, words(300+120*i))
			if r := post(t, gw.URL, "/v1/chat/completions", "sk-"+tenant, body); r.status != 200 {
				t.Fatalf("%s: warm-up %s: %d %s", name, tenant, r.status, r.body)
			}
		}
		before := decode.Stats(t).ForeignReplies
		r := post(t, gw.URL, c.path, "sk-z", c.body)
		if decode.Stats(t).ForeignReplies == before {
			t.Fatalf("%s: the simulator did not leak (the test needs it to): %d %.200s", name, r.status, r.body)
		}
		if bytes.Contains(r.body, []byte("KVG-")) || anyMarker.Match(r.body) {
			t.Fatalf("%s: marker bytes reached the client: %s", name, r.body)
		}
		switch {
		case c.stream && c.path == "/v1/messages":
			if r.status != 200 || !bytes.Contains(r.body, []byte("event: error\ndata: {\"error\":{\"message\"")) && !bytes.Contains(r.body, []byte(`"type":"error"`)) {
				t.Fatalf("%s: want an Anthropic error event: %d %s", name, r.status, r.body)
			}
		case c.stream:
			if r.status != 200 || !bytes.Contains(r.body, []byte("event: error\n")) || !bytes.Contains(r.body, []byte(`"upstream_integrity"`)) {
				t.Fatalf("%s: want an error event: %d %s", name, r.status, r.body)
			}
		case c.path == "/v1/messages":
			if r.status != 502 || !bytes.Contains(r.body, []byte(`"type":"error"`)) || !bytes.Contains(r.body, []byte(`"api_error"`)) {
				t.Fatalf("%s: want a 502 in Anthropic's envelope: %d %s", name, r.status, r.body)
			}
		default:
			if r.status != 502 || decodeError(t, r).Error.Code != "upstream_integrity" {
				t.Fatalf("%s: want 502 upstream_integrity: %d %s", name, r.status, r.body)
			}
		}
		for _, b := range []string{"p0", "d0"} {
			if a := postH(t, gw.URL+"/admin/backends/"+b+"/release", "", map[string]string{"Authorization": "Bearer admin-key"}); a.status != 200 {
				t.Fatalf("release %s: %d %s", b, a.status, a.body)
			}
		}
	}
}
