package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

const tenantKey = "sk-test-alice"

// gatewayYAML configures one tenant and the given backends (name=url=role triples).
func gatewayYAML(extra string, backends ...[3]string) string {
	var b strings.Builder
	b.WriteString("backends:\n")
	for _, be := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: %s}\n", be[0], be[1], be[2])
	}
	fmt.Fprintf(&b, "tenants:\n  - {name: alice, key_sha256: %q}\n", testkit.KeySHA256(tenantKey))
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	b.WriteString("capacity: {poll_interval: 200ms}\n")
	b.WriteString(extra)
	return b.String()
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(t testing.TB, url, path, key, body string) reply {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

func get(t testing.TB, url, key string) reply {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Param   *string `json:"param"`
	} `json:"error"`
}

func decodeError(t testing.TB, r reply) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("want an OpenAI error envelope, got %d %s", r.status, r.body)
	}
	return e
}

// words builds a prompt of n distinct-ish words (a few tokens each in every tokenizer).
func words(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "w%d ", i%997)
	}
	return b.String()
}

func TestUnifiedAdmissionEndToEnd(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))

	t.Run("oversized prompt gets 413 and never reaches the engine", func(t *testing.T) {
		before := sim.Stats(t)
		big := words(6000) // far over the 4,090-token max_req_input_len, under the 8,192 context
		for _, c := range []struct{ path, body, wording string }{
			{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"` + big + `"}]}`, "maximum context length"},
			{"/v1/completions", `{"model":"sim","prompt":"` + big + `"}`, "maximum context length"},
			{"/generate", `{"text":"` + big + `"}`, "Input length"},
		} {
			r := post(t, gw.URL, c.path, tenantKey, c.body)
			if r.status != 413 {
				t.Fatalf("%s: want 413, got %d %s", c.path, r.status, r.body)
			}
			e := decodeError(t, r)
			if e.Error.Code != "context_length_exceeded" || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, c.wording) {
				t.Fatalf("%s: wrong 413 body %s", c.path, r.body)
			}
			if r.header.Get("X-Kvgate-Tier") == "" || r.header.Get("X-Request-Id") == "" {
				t.Fatalf("%s: decision headers missing: %v", c.path, r.header)
			}
		}
		after := sim.Stats(t)
		for route, n := range after.Requests {
			if n != before.Requests[route] {
				t.Fatalf("an oversized request reached the engine on %s: %v → %v", route, before.Requests, after.Requests)
			}
		}
	})

	t.Run("normal prompt gets the engine's reply", func(t *testing.T) {
		r := post(t, gw.URL, "/generate", tenantKey, `{"text":"The capital of France is","sampling_params":{"max_new_tokens":4}}`)
		if r.status != 200 {
			t.Fatalf("want 200, got %d %s", r.status, r.body)
		}
		var g struct {
			Text     string `json:"text"`
			MetaInfo struct {
				ID               string `json:"id"`
				PromptTokens     int    `json:"prompt_tokens"`
				CompletionTokens int    `json:"completion_tokens"`
			} `json:"meta_info"`
		}
		if err := json.Unmarshal(r.body, &g); err != nil || g.MetaInfo.CompletionTokens != 4 || g.MetaInfo.PromptTokens < 4 || g.Text == "" {
			t.Fatalf("not the engine's /generate body: %s", r.body)
		}
		if !strings.HasPrefix(g.MetaInfo.ID, "kvg-") || g.MetaInfo.ID == r.header.Get("X-Request-Id") {
			t.Fatalf("the engine's rid %q must be the gateway's own, not the request id %q", g.MetaInfo.ID, r.header.Get("X-Request-Id"))
		}
		// A client's X-Request-Id is kept for the client and the logs, never sent as the rid.
		req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"hi","sampling_params":{"max_new_tokens":1}}`))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		req.Header.Set("X-Request-Id", "client-chosen-id")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get("X-Request-Id") != "client-chosen-id" || strings.Contains(string(b), "client-chosen-id") {
			t.Fatalf("X-Request-Id must come back unchanged and never reach the engine: %v %s", resp.Header, b)
		}
		// Engine headers are the engine's text, not ours to pass on: the simulator's ground truth
		// (which names other requests) must not reach a tenant.
		for k := range r.header {
			if strings.HasPrefix(k, "X-Sim-") {
				t.Fatalf("engine header %s reached the client: %v", k, r.header)
			}
		}
		c := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hi there"}],"max_tokens":3}`)
		var chat struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if c.status != 200 || json.Unmarshal(c.body, &chat) != nil || chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Usage.PromptTokens == 0 {
			t.Fatalf("chat: %d %s", c.status, c.body)
		}
	})

	t.Run("metrics count decisions and show the pool below the context", func(t *testing.T) {
		m := string(get(t, gw.URL+"/metrics", "admin-key").body)
		for _, want := range []string{
			`kvgate_admission_decisions_total{decision="refuse",reason="context_length_exceeded",tier="estimate"}`,
			`kvgate_admission_decisions_total{decision="admit",reason="ok",tier="bound"}`,
			`kvgate_backend_pool_below_context{backend="sim"} 1`,
			`kvgate_backend_max_req_input_len_tokens{backend="sim"} 4090`,
			`kvgate_upstream_responses_total{backend="sim",code="200"}`,
			`kvgate_admission_seconds_count`,
		} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("models reports the effective limit", func(t *testing.T) {
		r := get(t, gw.URL+"/v1/models", tenantKey)
		var m struct {
			Data []struct {
				MaxModelLen int `json:"max_model_len"`
			} `json:"data"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &m) != nil || len(m.Data) != 1 || m.Data[0].MaxModelLen != 4089 {
			t.Fatalf("want max_model_len 4089 (max_req_input_len 4090 − 1), got %d %s", r.status, r.body)
		}
	})

	t.Run("the limit is exact at the engine's boundary", func(t *testing.T) {
		// input_ids are exact: 4089 fits (P < 4090), 4090 does not.
		ids := func(n int) string { return strings.TrimSuffix(strings.Repeat("11,", n), ",") }
		if r := post(t, gw.URL, "/generate", tenantKey, `{"input_ids":[`+ids(4089)+`],"sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
			t.Fatalf("4089 ids: want 200, got %d %s", r.status, r.body)
		}
		if r := post(t, gw.URL, "/generate", tenantKey, `{"input_ids":[`+ids(4090)+`],"sampling_params":{"max_new_tokens":1}}`); r.status != 413 {
			t.Fatalf("4090 ids: want 413, got %d %s", r.status, r.body)
		}
		// prompt + output must stay under the context: 4000 + 4192 = 8192 is refused.
		if r := post(t, gw.URL, "/generate", tenantKey, `{"input_ids":[`+ids(4000)+`],"sampling_params":{"max_new_tokens":4192}}`); r.status != 413 {
			t.Fatalf("P+O = ctx: want 413, got %d %s", r.status, r.body)
		}
	})
}

func TestBadInputsAreRefusedAndNeverReachTheEngine(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("max_body_bytes: 65536\n", [3]string{"sim", sim.URL, "unified"})))
	before := sim.Stats(t)
	cases := []struct {
		name, path, key, body string
		status                int
		code, param           string
	}{
		{"no key", "/v1/chat/completions", "", `{"messages":[{"role":"user","content":"x"}]}`, 401, "invalid_api_key", ""},
		{"wrong key", "/v1/chat/completions", "sk-nope", `{"messages":[{"role":"user","content":"x"}]}`, 401, "invalid_api_key", ""},
		{"not json", "/v1/chat/completions", tenantKey, `{"messages":`, 400, "invalid_request", ""},
		{"json array", "/generate", tenantKey, `[1,2]`, 400, "invalid_request", ""},
		{"bad utf-8", "/generate", tenantKey, "{\"text\":\"\xff\xfe\"}", 400, "invalid_request", ""},
		{"missing messages", "/v1/chat/completions", tenantKey, `{"model":"sim"}`, 400, "invalid_request", "messages"},
		{"empty messages", "/v1/chat/completions", tenantKey, `{"messages":[]}`, 400, "invalid_request", "messages"},
		{"image part", "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]}`, 400, "invalid_request", "messages[0].content[0].image_url"},
		{"image_data", "/generate", tenantKey, `{"text":"x","image_data":"abc"}`, 400, "invalid_request", "image_data"},
		{"bootstrap_room", "/generate", tenantKey, `{"text":"x","bootstrap_room":5}`, 400, "invalid_request", "bootstrap_room"},
		{"bootstrap_host", "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"x"}],"bootstrap_host":"10.0.0.1"}`, 400, "invalid_request", "bootstrap_host"},
		{"rid", "/v1/completions", tenantKey, `{"prompt":"x","rid":"other-tenant-req"}`, 400, "invalid_request", "rid"},
		{"custom logit processor", "/generate", tenantKey, `{"text":"x","custom_logit_processor":"import os"}`, 400, "invalid_request", "custom_logit_processor"},
		{"input_embeds", "/generate", tenantKey, `{"input_embeds":[[0.1]]}`, 400, "invalid_request", "input_embeds"},
		{"unknown message field", "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"x","documents":["a long text"]}]}`, 400, "invalid_request", "messages[0].documents"},
		{"unknown field", "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"x"}],"frobnicate":1}`, 400, "invalid_request", "frobnicate"},
		{"negative max_tokens", "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, 400, "invalid_request", "max_tokens"},
		{"text and ids", "/generate", tenantKey, `{"text":"x","input_ids":[1]}`, 400, "invalid_request", "input_ids"},
		{"body too large", "/generate", tenantKey, `{"text":"` + strings.Repeat("a", 70000) + `"}`, 413, "request_too_large", ""},
		{"unknown route", "/v1/frobnicate", tenantKey, `{}`, 404, "not_found", ""},
		{"engine admin route", "/flush_cache", tenantKey, `{}`, 404, "not_found", ""},
		{"embeddings without input", "/v1/embeddings", tenantKey, `{}`, 400, "invalid_request", "input"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := post(t, gw.URL, c.path, c.key, c.body)
			if r.status != c.status {
				t.Fatalf("want %d, got %d %s", c.status, r.status, r.body)
			}
			e := decodeError(t, r)
			if e.Error.Code != c.code {
				t.Fatalf("want code %s, got %s", c.code, r.body)
			}
			if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
				t.Fatalf("want param %q, got %s", c.param, r.body)
			}
		})
	}
	if r := get(t, gw.URL+"/v1/chat/completions", tenantKey); r.status != 405 {
		t.Fatalf("GET on a POST route: want 405, got %d", r.status)
	}
	if r := get(t, gw.URL+"/admin/backends", tenantKey); r.status != 401 {
		t.Fatalf("a tenant key is not an admin key: got %d", r.status)
	}
	after := sim.Stats(t)
	for route, n := range after.Requests {
		if n != before.Requests[route] {
			t.Fatalf("a refused request reached the engine: %v → %v", before.Requests, after.Requests)
		}
	}
	// The gateway is still healthy after all that.
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"still fine","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("gateway unhealthy after bad inputs: %d %s", r.status, r.body)
	}
}

func TestStreamArrivesEventByEvent(t *testing.T) {
	const delay = 150 * time.Millisecond
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", delay.String())
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"count with me please"}],"max_tokens":5,"stream":true}`},
		{"/generate", `{"text":"count with me please","sampling_params":{"max_new_tokens":5},"stream":true}`},
	} {
		req, _ := http.NewRequest("POST", gw.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, resp.Header)
		}
		var arrivals []time.Duration
		sc := bufio.NewScanner(resp.Body)
		done := false
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "data: ") {
				arrivals = append(arrivals, time.Since(start))
				done = done || line == "data: [DONE]"
			}
		}
		resp.Body.Close()
		if !done || len(arrivals) < 5 {
			t.Fatalf("%s: want ≥5 events ending in [DONE], got %d", c.path, len(arrivals))
		}
		// The events were produced delay apart; relayed as they came, the first content event
		// arrives well before the last (buffering would deliver them all at once).
		span := arrivals[len(arrivals)-1] - arrivals[0]
		if span < 3*delay {
			t.Fatalf("%s: events arrived within %s of each other; the %s token delay was buffered away (arrivals %v)", c.path, span, delay, arrivals)
		}
	}
}

func TestRestartedSmallerPoolLowersTheLimitAndStoppedEngineGives503(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "16384")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	limit := func() int {
		r := get(t, gw.URL+"/v1/models", tenantKey)
		var m struct {
			Data []struct {
				MaxModelLen int `json:"max_model_len"`
			} `json:"data"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &m) != nil || len(m.Data) == 0 {
			return -r.status
		}
		return m.Data[0].MaxModelLen
	}
	if got := limit(); got != 8185 {
		t.Fatalf("want 8185, got %d", got)
	}
	ids := `{"input_ids":[` + strings.TrimSuffix(strings.Repeat("7,", 3000), ",") + `],"sampling_params":{"max_new_tokens":1}}`
	if r := post(t, gw.URL, "/generate", tenantKey, ids); r.status != 200 {
		t.Fatalf("3000 ids fit the big pool: %d %s", r.status, r.body)
	}
	sim.Restart(t, "--mode", "combined", "--pool-tokens", "2048", "--context-length", "16384")
	restarted := time.Now()
	for limit() != 2041 {
		if time.Since(restarted) > 2*time.Second { // poll interval 200 ms, with slack for a slow CI
			t.Fatalf("limit did not drop after the restart: %d", limit())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("new limit seen %s after the restart (poll interval 200ms)", time.Since(restarted))
	if r := post(t, gw.URL, "/generate", tenantKey, ids); r.status != 413 {
		t.Fatalf("3000 ids no longer fit: want 413, got %d %s", r.status, r.body)
	}
	sim.Stop()
	stopped := time.Now()
	for {
		r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hello","sampling_params":{"max_new_tokens":1}}`)
		if r.status == 503 {
			e := decodeError(t, r)
			if r.header.Get("Retry-After") == "" || (e.Error.Code != "no_backend" && e.Error.Code != "capacity_unknown") {
				t.Fatalf("503 without Retry-After or right code: %v %s", r.header, r.body)
			}
			break
		}
		if r.status != 502 && r.status != 200 {
			t.Fatalf("unexpected %d %s", r.status, r.body)
		}
		if time.Since(stopped) > 3*time.Second {
			t.Fatalf("still no 503 after the engine stopped: %d %s", r.status, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// decode one event stream into its data payloads.
func dataLines(body []byte) []string {
	var out []string
	for _, l := range bytes.Split(body, []byte("\n")) {
		if bytes.HasPrefix(l, []byte("data: ")) {
			out = append(out, string(l[6:]))
		}
	}
	return out
}

// A client that goes away mid-stream must not leave the engine generating for nobody: the
// gateway closes the upstream and aborts the request, so the engine's pages come back.
func TestClientDisconnectAbortsTheEngine(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", "100ms")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	total := sim.Stats(t).Pool.PagesTotal
	req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"`+words(300)+`","sampling_params":{"max_new_tokens":600},"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first event arrived: generation is under way
		t.Fatal(err)
	}
	if free := sim.Stats(t).Pool.PagesFree; free == total {
		t.Fatalf("the request should hold pages while generating (free %d of %d)", free, total)
	}
	resp.Body.Close() // the client goes away; 600 tokens at 100 ms would take a minute
	deadline := time.Now().Add(5 * time.Second)
	for sim.Stats(t).Pool.PagesFree != total {
		if time.Now().After(deadline) {
			t.Fatalf("engine still holds pages 5 s after the client left: free %d of %d", sim.Stats(t).Pool.PagesFree, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
