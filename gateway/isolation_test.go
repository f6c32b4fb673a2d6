package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Tenant isolation: only the bearer key picks the tenant; admin routes need the admin key;
// nothing a tenant can send makes an error body or a log line carry a key or a marker; request
// ids open nobody else's incident or request.

const bobKey = "sk-test-bob"

func isolationYAML(url, extra string) string {
	return fmt.Sprintf(`backends: [{name: eng, url: %q, role: unified}]
tenants:
  - {name: alice, key_sha256: %q}
  - {name: bob, key_sha256: %q, max_prompt_tokens: 40}
admin_key_sha256: %q
capacity: {poll_interval: 200ms}
%s`, url, testkit.KeySHA256(tenantKey), testkit.KeySHA256(bobKey), testkit.KeySHA256("admin-key"), extra)
}

// Headers and body fields that name a tenant are ignored: bob (max_prompt_tokens 40) stays bob
// whatever he claims, and alice stays alice.
func TestIsolationOnlyTheKeyPicksTheTenant(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, isolationYAML(sim.URL, "")))
	long := words(60) // well over bob's 40 tokens, far under the pool
	claims := []struct {
		name    string
		headers map[string]string
		fields  string
	}{
		{"X-Tenant", map[string]string{"X-Tenant": "%s"}, ""},
		{"X-Tenant-Id", map[string]string{"X-Tenant-Id": "%s"}, ""},
		{"X-Kvgate-Tenant", map[string]string{"X-Kvgate-Tenant": "%s"}, ""},
		{"X-Forwarded-User", map[string]string{"X-Forwarded-User": "%s", "X-Forwarded-For": "10.0.0.1"}, ""},
		{"X-Api-Key of the other", map[string]string{"X-Api-Key": "%k"}, ""},
		{"OpenAI-Organization", map[string]string{"OpenAI-Organization": "%s", "OpenAI-Project": "%s"}, ""},
		{"second Authorization", map[string]string{"Authorization2": "Bearer %k"}, ""},
		{"user field", nil, `,"user":"%s"`},
		{"metadata tenant", nil, `,"metadata":{"tenant":"%s","user":"%s"}`},
	}
	ask := func(key, other, otherKey string, c int, routeChat bool) reply {
		cl := claims[c]
		fields := strings.ReplaceAll(strings.ReplaceAll(cl.fields, "%s", other), "%k", otherKey)
		body := `{"messages":[{"role":"user","content":"` + long + `"}],"max_tokens":1` + fields + `}`
		req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		for k, v := range cl.headers {
			req.Header.Set(k, strings.ReplaceAll(strings.ReplaceAll(v, "%s", other), "%k", otherKey))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{resp.StatusCode, resp.Header, b}
	}
	for i, c := range claims {
		t.Run(c.name, func(t *testing.T) {
			if r := ask(bobKey, "alice", tenantKey, i, true); r.status != 413 || decodeError(t, r).Error.Code != "context_length_exceeded" || !strings.Contains(string(r.body), "this API key's limit") {
				t.Fatalf("bob claiming to be alice: want bob's 413, got %d %s", r.status, r.body)
			}
			if r := ask(tenantKey, "bob", bobKey, i, true); r.status != 200 {
				t.Fatalf("alice claiming to be bob: want alice's 200, got %d %s", r.status, r.body)
			}
		})
	}
	// A "tenant" field is not an allowed field at all.
	if r := post(t, gw.URL, "/v1/completions", bobKey, `{"prompt":"x","tenant":"alice"}`); r.status != 400 {
		t.Fatalf("tenant field: %d %s", r.status, r.body)
	}
	// /v1/models answers for the key's tenant, whatever else is claimed.
	req, _ := http.NewRequest("GET", gw.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+bobKey)
	req.Header.Set("X-Tenant", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if len(m.Data) != 1 || m.Data[0].MaxModelLen != 40 {
		t.Fatalf("bob's /v1/models: %+v", m)
	}
	// The stored hash is not a key.
	if r := post(t, gw.URL, "/generate", testkit.KeySHA256(tenantKey), `{"text":"x"}`); r.status != 401 {
		t.Fatalf("the key's hash as a bearer: %d", r.status)
	}
}

// Every admin route refuses everything but the admin key; no route lets a tenant read incidents.
// The 32 wrong keys below come from one address: the throttle (admin TestThrottle*, which would
// answer 429 after 5) is set loose here so that each one is checked and refused on its merits.
func TestIsolationAdminRoutesNeedTheAdminKey(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, isolationYAML(sim.URL, "server: {auth_throttle: {free_failures: 1000, lockout_after: 1001}}\n")))
	routes := []struct{ method, path, body string }{
		{"GET", "/admin/backends", ""},
		{"GET", "/admin/incidents", ""},
		{"GET", "/admin/incidents?limit=5&request_id=kvg-1", ""},
		{"GET", "/admin/tenants", ""},
		{"POST", "/admin/tenants", `{"name":"mallory","key_sha256":"` + testkit.KeySHA256("sk-mallory") + `"}`},
		{"PATCH", "/admin/tenants/bob", `{"max_prompt_tokens":0}`},
		{"DELETE", "/admin/tenants/bob", ""},
		{"POST", "/admin/backends/eng/release", ""},
	}
	creds := []struct {
		name string
		set  func(*http.Request)
	}{
		{"none", func(*http.Request) {}},
		{"tenant key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tenantKey) }},
		{"wrong key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer admin-kez") }},
		{"admin key with a suffix", func(r *http.Request) { r.Header.Set("Authorization", "Bearer admin-key2") }},
		{"admin key hash", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testkit.KeySHA256("admin-key")) }},
		{"admin key as X-Api-Key", func(r *http.Request) { r.Header.Set("X-Api-Key", "admin-key") }},
		{"admin key as Basic", func(r *http.Request) { r.SetBasicAuth("admin", "admin-key") }},
		{"admin key in the query", func(r *http.Request) {
			q := r.URL.Query()
			q.Set("key", "admin-key")
			r.URL.RawQuery = q.Encode()
		}},
	}
	for _, rt := range routes {
		for _, c := range creds {
			req, _ := http.NewRequest(rt.method, gw.URL+rt.path, strings.NewReader(rt.body))
			c.set(req)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 401 {
				t.Errorf("%s %s with %s: want 401, got %d %s", rt.method, rt.path, c.name, resp.StatusCode, b)
			}
		}
	}
	// The tenant bob still exists and is unchanged (no write above went through).
	if r := post(t, gw.URL, "/v1/completions", bobKey, `{"prompt":"`+words(60)+`","max_tokens":1}`); r.status != 413 {
		t.Fatalf("bob changed by a refused admin call: %d %s", r.status, r.body)
	}
	// Tenant-facing incident lookups do not exist.
	for _, p := range []string{"/v1/incidents", "/incidents", "/v1/incidents/kvg-1", "/v1/requests/kvg-1", "/admin/incidents/kvg-1"} {
		r := get(t, gw.URL+p, tenantKey)
		if r.status != 404 && r.status != 401 {
			t.Errorf("GET %s with a tenant key: %d %s", p, r.status, r.body)
		}
	}
	if r := get(t, gw.URL+"/admin/incidents", "admin-key"); r.status != 200 {
		t.Fatalf("the admin key: %d %s", r.status, r.body)
	}
}

// observedGateway is testkit.StartGateway with every log line (access lines included) kept.
func observedGateway(t *testing.T, cfg *config.Config) (*testkit.Gateway, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	return testkit.StartGatewayWithLogger(t, cfg, zap.New(core)), logs
}

// Keys and markers never appear in an error body or a log line: wrong keys, right keys, an
// engine error that quotes the prompt (with the requester's injected marker), a reply that leaks
// another tenant's marker, a request that carries a foreign marker itself.
func TestIsolationNoKeyOrMarkerInErrorsOrLogs(t *testing.T) {
	var mu sync.Mutex
	var handler fasthttp.RequestHandler = okGenerate
	url := fakeUnified(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		h := handler
		mu.Unlock()
		h(ctx)
	})
	setReply := func(h fasthttp.RequestHandler) { mu.Lock(); handler = h; mu.Unlock() }
	cfg := testkit.ParseConfig(t, isolationYAML(url, fmt.Sprintf("canary: {enabled: true, secret: %q}\n", canarySecret)))
	gw, logs := observedGateway(t, cfg)
	kr := canary.NewKeyring([]byte(canarySecret), cfg.Canary.Epoch, cfg.Canary.DetectWindow, []string{"alice", "bob"})
	aliceMarker, _ := kr.Current("alice", time.Now())
	bobMarker, _ := kr.Current("bob", time.Now())
	secrets := []string{tenantKey, bobKey, "admin-key", "sk-typo-" + tenantKey, canarySecret,
		aliceMarker, aliceMarker[len(canary.MarkerPrefix):], bobMarker, bobMarker[len(canary.MarkerPrefix):]}
	var bodies []string
	send := func(key, path, body string) reply {
		r := post(t, gw.URL, path, key, body)
		bodies = append(bodies, string(r.body))
		return r
	}
	// Wrong and malformed keys.
	send("sk-typo-"+tenantKey, "/generate", `{"text":"x"}`)
	send(tenantKey[:len(tenantKey)-1], "/generate", `{"text":"x"}`)
	send("", "/generate", `{"text":"x"}`)
	// Good keys, bad bodies.
	send(tenantKey, "/generate", `{"text":`)
	send(bobKey, "/generate", `{"text":"`+words(60)+`"}`)
	// An engine error quoting the prompt it got, which carries the requester's marker.
	setReply(func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(400)
		ctx.SetContentType("application/json")
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": "bad prompt: " + string(ctx.PostBody())}})
		ctx.SetBody(b)
	})
	if r := send(tenantKey, "/generate", `{"text":"quote me"}`); r.status != 400 {
		t.Fatalf("engine error passthrough: %d %s", r.status, r.body)
	}
	// An engine that answers bob with alice's marker: a leak, cut; the incident is recorded.
	setReply(func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"text":"stale ` + aliceMarker + ` page","meta_info":{"id":"x","prompt_tokens":1,"completion_tokens":1}}`)
	})
	if r := send(bobKey, "/generate", `{"text":"hi"}`); r.status != 502 {
		t.Fatalf("a leak: %d %s", r.status, r.body)
	}
	// A client that sends a marker of someone else in its prompt (an echo).
	setReply(okGenerate)
	send(bobKey, "/generate", `{"text":"`+aliceMarker+`"}`)
	for _, b := range bodies {
		for _, s := range secrets {
			if strings.Contains(b, s) {
				t.Errorf("an error body carries %q: %.300s", s, b)
			}
		}
	}
	// Give the background incident write a moment, then read every log line and field.
	time.Sleep(200 * time.Millisecond)
	n := 0
	for _, e := range logs.All() {
		n++
		line := e.Message
		for k, v := range e.ContextMap() {
			line += fmt.Sprintf(" %s=%v", k, v)
		}
		for _, s := range secrets {
			if strings.Contains(line, s) {
				t.Errorf("a log line carries %q: %s", s, line)
			}
		}
	}
	if n < 8 {
		t.Fatalf("only %d log lines observed: the test saw nothing", n)
	}
	// The incident itself (admin only) names the victim but not the marker.
	r := get(t, gw.URL+"/admin/incidents", "admin-key")
	if r.status != 200 || !strings.Contains(string(r.body), `"alice"`) || strings.Contains(string(r.body), aliceMarker[len(canary.MarkerPrefix):]) {
		t.Fatalf("incidents: %d %s", r.status, r.body)
	}
}

// Request ids are the client's label only: a tenant that reuses another's X-Request-Id and then
// walks away (which aborts its engine request) does not touch the other's stream; the engine sees
// the gateway's own rids.
func TestIsolationRequestIDsCannotReachAnotherRequest(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "30ms")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, isolationYAML(sim.URL, "")))
	const rid = "shared-request-id-1"
	open := func(key string) (*http.Response, *bufio.Reader) {
		req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"a stream","sampling_params":{"max_new_tokens":40},"stream":true}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Request-Id", rid)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream: %v %v", err, resp)
		}
		if resp.Header.Get("X-Request-Id") != rid {
			t.Fatalf("X-Request-Id not echoed: %q", resp.Header.Get("X-Request-Id"))
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		return resp, br
	}
	aliceResp, aliceBody := open(tenantKey)
	defer aliceResp.Body.Close()
	bobResp, _ := open(bobKey)
	bobResp.Body.Close() // bob walks away: the gateway aborts bob's engine request
	rest, err := io.ReadAll(aliceBody)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Contains(string(rest), `"error"`) {
		t.Fatalf("alice's stream was disturbed by bob's abort of the same X-Request-Id: %v %.300q", err, rest)
	}
	// Neither can look the request up.
	for _, key := range []string{tenantKey, bobKey} {
		if r := get(t, gw.URL+"/admin/incidents?request_id="+rid, key); r.status != 401 {
			t.Fatalf("incident lookup by request id with a tenant key: %d", r.status)
		}
	}
}
