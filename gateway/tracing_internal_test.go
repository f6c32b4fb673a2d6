package gateway

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/request"
)

// With tracing off (no OTEL_* variables) the hooks on the request path return at once: no span,
// no traceparent, no allocation.
func TestTracingOffCostsNoAllocation(t *testing.T) {
	x := &exchange{g: &Gateway{}, kind: request.Chat}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	b := &backends.Backend{Name: "engine"}
	var traceparent string
	allocs := testing.AllocsPerRun(200, func() {
		x.startSpan(&ctx)
		x.spanAdmitted()
		tp, leg := x.startLeg("unified", b)
		traceparent = tp
		x.legRelayed(leg, 200)
		x.endLeg(leg, 200, nil)
		x.endSpan()
	})
	if allocs != 0 || traceparent != "" || x.span != nil || x.relayLeg != nil {
		t.Fatalf("tracing off: %v allocations per request, traceparent %q, span %v", allocs, traceparent, x.span)
	}
}
