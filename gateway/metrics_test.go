package gateway_test

import (
	"bufio"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// The per-request families, against the simulator: time to first token and inter-token latency
// of a stream, end-to-end duration, tokens of a tenant without limits, all labelled with the model
// the engine advertises; a model no engine advertises is "other"; build info; one quantity per
// capacity family.
func TestRequestMetricsByModel(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "20ms")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))

	// A stream of 6 tokens (alice has no limits: her tokens are counted all the same).
	req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(
		`{"model":"sim","messages":[{"role":"user","content":"count to six"}],"max_tokens":6,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			events++
		}
		if strings.Contains(sc.Text(), `"usage"`) {
			t.Fatalf("usage the client did not ask for reached it: %s", sc.Text())
		}
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || events < 6 {
		t.Fatalf("stream: %d, %d events", resp.StatusCode, events)
	}
	// A whole reply, whose usage is read from its body.
	g := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"a-model-nobody-serves","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	if g.status != 200 {
		t.Fatalf("chat: %d %s", g.status, g.body)
	}
	// Refused before any route: its model is one no backend advertises.
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-unknown", `{"model":"made-up-model","messages":[]}`); r.status != 401 {
		t.Fatalf("unknown key: %d", r.status)
	}

	if n := metric(t, gw.URL, "kvgate_time_to_first_token_seconds_count", `model="sim"`); n != 1 {
		t.Errorf("time to first token observed %v times, want 1 (the stream)", n)
	}
	gaps := metric(t, gw.URL, "kvgate_inter_token_latency_seconds_count", `model="sim"`)
	sum := metric(t, gw.URL, "kvgate_inter_token_latency_seconds_sum", `model="sim"`)
	if gaps < 5 || sum/gaps < 0.010 {
		// 6 tokens 20 ms apart: 5 gaps, each at least the simulator's delay (minus scheduling slack).
		t.Errorf("inter-token latency: %v gaps, mean %.4fs; want ≥ 5 gaps of about 20 ms", gaps, sum/max(gaps, 1))
	}
	if n := metric(t, gw.URL, "kvgate_request_duration_seconds_count", `model="sim"`, `route="/v1/chat/completions"`); n != 2 {
		t.Errorf("request duration observed %v times for model sim, want 2 (the model a request names is not a label; the engine's is)", n)
	}
	if n := metric(t, gw.URL, "kvgate_request_duration_seconds_count", `model="other"`); n != 1 {
		t.Errorf("the refused request's duration: %v observations under model=\"other\", want 1", n)
	}
	out := metric(t, gw.URL, "kvgate_tokens_total", `tenant="alice"`, `model="sim"`, `direction="output"`)
	in := metric(t, gw.URL, "kvgate_tokens_total", `tenant="alice"`, `model="sim"`, `direction="input"`)
	if out != 6+3 || in <= 0 {
		t.Errorf("tokens of a tenant without limits: input %v, output %v (want the 6 streamed plus 3 whole)", in, out)
	}
	body := string(get(t, gw.URL+"/metrics", "admin-key").body)
	for _, want := range []string{
		`kvgate_build_info{go_version="go`,
		`kvgate_backend_pool_tokens{backend="sim"} 8192`,
		`kvgate_backend_context_tokens{backend="sim"} 8192`,
		`kvgate_backend_max_req_input_len_tokens{backend="sim"} `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, gone := range []string{"kvgate_backend_capacity_tokens", "a-model-nobody-serves", "made-up-model"} {
		if strings.Contains(body, gone) {
			t.Errorf("metrics still show %s", gone)
		}
	}
}

// Transport errors are counted by name, not as code="0": an engine that closes the connection
// before answering is "reset", one that does not answer within the header timeout is "timeout".
func TestUpstreamTransportErrorsNamed(t *testing.T) {
	var mode atomic.Value
	mode.Store("")
	url := fakeUnified(t, func(ctx *fasthttp.RequestCtx) {
		switch mode.Load().(string) {
		case "reset":
			_ = ctx.Conn().Close() // no status line: the gateway reads a closed connection
		case "slow":
			time.Sleep(1500 * time.Millisecond)
			okGenerate(ctx)
		}
	})
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("upstream: {response_header_timeout: 300ms}\n", [3]string{"fake", url, "unified"})))
	mode.Store("reset")
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 502 {
		t.Fatalf("reset engine: %d %s", r.status, r.body)
	}
	mode.Store("slow")
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 504 {
		t.Fatalf("slow engine: %d %s", r.status, r.body)
	}
	body := string(get(t, gw.URL+"/metrics", "admin-key").body)
	for _, want := range []string{`kvgate_upstream_responses_total{backend="fake",code="reset"} 1`, `kvgate_upstream_responses_total{backend="fake",code="timeout"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s:\n%s", want, regexp.MustCompile(`(?m)^kvgate_upstream.*$`).FindAllString(body, -1))
		}
	}
	if strings.Contains(body, `code="0"`) {
		t.Errorf("a transport error is still code=\"0\"")
	}
}
