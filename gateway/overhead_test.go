package gateway

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/lab/enginesim"
)

// Every forwarded request observes before_upstream and after_headers once; a stream also
// observes stream_read for the upstream reads it relayed.
func TestOverheadHistogramObservesEachPhase(t *testing.T) {
	g := inmemGateway(t, enginesim.Config{FastEvents: 3})
	var ctx fasthttp.RequestCtx
	if code, body := serveOne(t, g, &ctx, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	if code, body := serveOne(t, g, &ctx, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`); code != 200 || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("status %d: %s", code, body)
	}
	count := func(phase string) int {
		mfs, err := g.metrics.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "kvgate_overhead_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == phase {
					return int(m.GetHistogram().GetSampleCount())
				}
			}
		}
		return -1
	}
	if n := count(phaseBeforeUpstream); n != 2 {
		t.Errorf("before_upstream observed %d times, want 2", n)
	}
	if n := count(phaseAfterHeaders); n != 2 {
		t.Errorf("after_headers observed %d times, want 2", n)
	}
	if n := count(phaseStreamRead); n < 1 {
		t.Errorf("stream_read observed %d times, want at least 1", n)
	}
}
