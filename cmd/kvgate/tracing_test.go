package main

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// otlpReceiver is an OTLP/HTTP trace receiver on loopback: it decodes every export request
// (protobuf, gzip or not) and keeps the spans with their service name.
type otlpReceiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	spans   []*tracepb.Span
	service string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Method != "POST" {
			http.NotFound(w, req)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		var export coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &export)
		}
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			if v := attr(rs.GetResource().GetAttributes(), "service.name"); v != "" {
				r.service = v
			}
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) snapshot() ([]*tracepb.Span, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), r.service
}

// attr is a string (or integer, as text) attribute's value, "" when absent.
func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return fmt.Sprint(v.IntValue)
			}
		}
	}
	return ""
}

// fakeEngine is an engine on loopback in one role ("null" is unified) that answers capacity reads
// and chat requests, and keeps every traceparent it was sent.
type fakeEngine struct {
	srv          *httptest.Server
	mu           sync.Mutex
	traceparents []string
}

func startFakeEngine(t *testing.T, mode string) *fakeEngine {
	e := &fakeEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/server_info", "/get_server_info":
			fmt.Fprintf(w, `{"max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":16,"disaggregation_mode":%q,"disaggregation_bootstrap_port":8998}`, mode)
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","max_model_len":8192}]}`)
		case "/v1/chat/completions":
			_, _ = io.Copy(io.Discard, r.Body)
			e.mu.Lock()
			e.traceparents = append(e.traceparents, r.Header.Get("Traceparent"))
			e.mu.Unlock()
			fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":0,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)
		case "/abort_request":
			fmt.Fprint(w, `{}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) got() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.traceparents...)
}

// Traces with the OTEL_* variables, through a real process: a request that carries a W3C
// traceparent gets a SERVER span in that trace (GenAI attributes, tenant, model, usage), a CLIENT
// span per PD leg, and each engine gets the traceparent of its leg's span; the spans reach an
// OTLP/HTTP receiver (flushed at the latest when the process stops).
func TestTracesReachOTLPAndEngines(t *testing.T) {
	recv := startOTLPReceiver(t)
	prefill, decode := startFakeEngine(t, "prefill"), startFakeEngine(t, "decode")
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends:
  - {name: p, url: %q, role: prefill}
  - {name: d, url: %q, role: decode}
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
server: {drain_delay: 0s}
`, port, prefill.srv.URL, decode.srv.URL, config.SHA256Hex("sk-trace")))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs, "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_SERVICE_NAME=kvgate-under-test")
	defer cmd.Process.Kill()

	const traceID, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(
		`{"model":"fake-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`))
	req.Header.Set("Authorization", "Bearer sk-trace")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+clientSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat through the PD pair: %d %s\n%s", resp.StatusCode, body, logs.String())
	}
	// Each leg's engine got a traceparent in the client's trace, naming the leg's own span.
	legSpan := map[string]string{}
	for name, e := range map[string]*fakeEngine{"prefill": prefill, "decode": decode} {
		got := e.got()
		if len(got) != 1 {
			t.Fatalf("%s engine: %d requests, want 1", name, len(got))
		}
		parts := strings.Split(got[0], "-")
		if len(parts) != 4 || parts[0] != "00" || parts[1] != traceID || parts[2] == clientSpan || len(parts[2]) != 16 || parts[3] != "01" {
			t.Fatalf("%s engine got traceparent %q, want one in trace %s naming kvgate's leg span", name, got[0], traceID)
		}
		legSpan[name] = parts[2]
	}
	if legSpan["prefill"] == legSpan["decode"] {
		t.Fatalf("both legs were sent the same span id %s", legSpan["prefill"])
	}

	_ = cmd.Process.Signal(syscall.SIGTERM) // the exit flushes what the batcher still holds
	if code := exitCode(t, cmd, 15*time.Second, logs); code != 0 {
		t.Fatalf("serve exited %d:\n%s", code, logs.String())
	}
	spans, service := recv.snapshot()
	if service != "kvgate-under-test" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", service)
	}
	var server *tracepb.Span
	clients := map[string]*tracepb.Span{}
	for _, sp := range spans {
		if hex.EncodeToString(sp.TraceId) != traceID {
			continue
		}
		switch sp.Kind {
		case tracepb.Span_SPAN_KIND_SERVER:
			server = sp
		case tracepb.Span_SPAN_KIND_CLIENT:
			clients[attr(sp.Attributes, "kvgate.leg")] = sp
		}
	}
	if server == nil {
		t.Fatalf("no server span in trace %s among %d spans\n%s", traceID, len(spans), logs.String())
	}
	if p := hex.EncodeToString(server.ParentSpanId); p != clientSpan {
		t.Errorf("the exchange's span has parent %s, want the client's %s", p, clientSpan)
	}
	for k, want := range map[string]string{
		"gen_ai.operation.name": "chat", "gen_ai.request.model": "fake-model", "gen_ai.provider.name": "sglang",
		"gen_ai.usage.input_tokens": "5", "gen_ai.usage.output_tokens": "2", "kvgate.tenant": "alice", "kvgate.model": "fake-model",
		"http.response.status_code": "200",
	} {
		if got := attr(server.Attributes, k); got != want {
			t.Errorf("server span %s = %q, want %q", k, got, want)
		}
	}
	if server.Name != "chat fake-model" {
		t.Errorf("server span named %q, want GenAI's \"{operation} {model}\"", server.Name)
	}
	for _, leg := range []string{"prefill", "decode"} {
		sp := clients[leg]
		if sp == nil {
			t.Fatalf("no %s leg span", leg)
		}
		if hex.EncodeToString(sp.SpanId) != legSpan[leg] || hex.EncodeToString(sp.ParentSpanId) != hex.EncodeToString(server.SpanId) {
			t.Errorf("%s leg span %x (parent %x): want the span the engine was sent (%s), child of the exchange's", leg, sp.SpanId, sp.ParentSpanId, legSpan[leg])
		}
		if attr(sp.Attributes, "gen_ai.operation.name") != "chat" || attr(sp.Attributes, "kvgate.tenant") != "alice" || attr(sp.Attributes, "http.response.status_code") != "200" {
			t.Errorf("%s leg span attributes: %v", leg, sp.Attributes)
		}
	}
	if !strings.Contains(logs.String(), `"trace_id":"`+traceID+`"`) {
		t.Errorf("the access line does not name the trace:\n%s", logs.String())
	}
}

// Without OTEL_* variables nothing is traced: the engine gets no traceparent.
func TestNoTracesWithoutOTELVariables(t *testing.T) {
	engine := startFakeEngine(t, "null")
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: u, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
server: {drain_delay: 0s}
`, port, engine.srv.URL, config.SHA256Hex("sk-trace")))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs, "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_TRACES_EXPORTER=")
	defer cmd.Process.Kill()
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(`{"model":"fake-model","messages":[{"role":"user","content":"hello"}]}`))
	req.Header.Set("Authorization", "Bearer sk-trace")
	req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := engine.got(); resp.StatusCode != 200 || len(got) != 1 || got[0] != "" {
		t.Fatalf("status %d, engine traceparents %q: want one request and no traceparent", resp.StatusCode, got)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd, 15*time.Second, logs); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
}
