package gateway_test

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// accessLine is the one access line of request id rid.
func accessLine(t *testing.T, logs *observer.ObservedLogs, rid string) map[string]any {
	t.Helper()
	var found []map[string]any
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		found = found[:0]
		for _, e := range logs.FilterLoggerName("access").All() {
			if m := e.ContextMap(); m["request_id"] == rid {
				found = append(found, m)
			}
		}
		if len(found) > 0 || time.Now().After(end) {
			break
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one access line for %s, got %d", rid, len(found))
	}
	return found[0]
}

func durationField(t *testing.T, m map[string]any, k string) time.Duration {
	t.Helper()
	d, ok := m[k].(time.Duration)
	if !ok {
		t.Fatalf("access line without %s: %v", k, m)
	}
	return d
}

// The access line names the client's address, the method, the model and the tokens settled;
// a stream's line also says when its first bytes and its first generated token reached the
// client. A tenant without limits (no usage read) gets the same line without the usage.
func TestAccessLogFields(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw, logs := observedGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "rpm: 1000, tpm: 1000000", "", sim.URL)))

	common := func(m map[string]any, route string) {
		t.Helper()
		if !strings.HasPrefix(m["client_addr"].(string), "127.0.0.1:") || m["method"] != "POST" || m["route"] != route ||
			m["status"] != int64(200) || m["upstream"] != "sim" || m["engine_rid"] == "" {
			t.Fatalf("access line: %v", m)
		}
		if durationField(t, m, "latency") <= 0 {
			t.Fatalf("access line without latency: %v", m)
		}
	}

	whole := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`)
	if whole.status != 200 {
		t.Fatalf("whole: %d %s", whole.status, whole.body)
	}
	m := accessLine(t, logs, whole.header.Get("X-Request-Id"))
	common(m, "/v1/chat/completions")
	if m["tenant"] != "alice" || m["model"] != "sim" || m["usage"] != "engine" || m["tier"] != "bound" {
		t.Fatalf("whole: %v", m)
	}
	if p, c := m["prompt_tokens"].(int64), m["completion_tokens"].(int64); p <= 0 || c <= 0 || c > 4 {
		t.Fatalf("whole: usage %d+%d: %v", p, c, m)
	}
	if _, ok := m["ttfb"]; ok {
		t.Fatalf("a whole reply has no time to first byte: %v", m)
	}

	stream := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":6,"stream":true}`)
	if stream.status != 200 || !strings.Contains(string(stream.body), "data: [DONE]") {
		t.Fatalf("stream: %d %s", stream.status, stream.body)
	}
	if strings.Contains(string(stream.body), `"usage"`) {
		t.Fatalf("the usage the gateway asked for reached a client that did not: %s", stream.body)
	}
	m = accessLine(t, logs, stream.header.Get("X-Request-Id"))
	common(m, "/v1/chat/completions")
	if m["model"] != "sim" || m["usage"] != "engine" {
		t.Fatalf("stream: %v", m)
	}
	if p, c := m["prompt_tokens"].(int64), m["completion_tokens"].(int64); p <= 0 || c <= 0 || c > 6 {
		t.Fatalf("stream: usage %d+%d: %v", p, c, m)
	}
	ttfb, ttft, lat := durationField(t, m, "ttfb"), durationField(t, m, "ttft"), durationField(t, m, "latency")
	if ttfb <= 0 || ttft <= 0 || ttfb > lat || ttft > lat {
		t.Fatalf("stream: ttfb %v, ttft %v, latency %v", ttfb, ttft, lat)
	}

	native := post(t, gw.URL, "/generate", "sk-bob", `{"text":"hello","sampling_params":{"max_new_tokens":2},"stream":true}`)
	if native.status != 200 {
		t.Fatalf("bob: %d %s", native.status, native.body)
	}
	m = accessLine(t, logs, native.header.Get("X-Request-Id"))
	common(m, "/generate")
	if m["tenant"] != "bob" || m["model"] != "" {
		t.Fatalf("bob: %v", m)
	}
	if m["usage"] != "engine" || m["completion_tokens"] != int64(2) {
		t.Fatalf("a tenant without limits: its usage is read and logged all the same (kvgate_tokens_total counts every tenant): %v", m)
	}
	durationField(t, m, "ttfb")

	tok := post(t, gw.URL, "/v1/tokenize", tenantKey, `{"model":"sim","prompt":"hello there"}`)
	if tok.status != 200 {
		t.Fatalf("tokenize: %d %s", tok.status, tok.body)
	}
	m = accessLine(t, logs, tok.header.Get("X-Request-Id"))
	common(m, "/v1/tokenize")
	if m["tenant"] != "alice" || m["model"] != "sim" || m["usage"] != "engine" || m["prompt_tokens"].(int64) <= 0 || m["completion_tokens"] != int64(0) {
		t.Fatalf("tokenize: %v", m)
	}
}
