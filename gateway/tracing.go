package gateway

import (
	"context"
	"strconv"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/telemetry"
)

// Traces: one SERVER span per exchange (continuing the client's traceparent), one CLIENT span per
// engine leg (unified, or prefill and decode), whose traceparent the engine gets. Attributes follow
// OpenTelemetry's GenAI semantic conventions (gen_ai.*) plus kvgate.tenant and kvgate.model. With
// tracing off (g.tracer nil) every function here returns at its first line: no allocation.

// SetTracing turns tracing on (t non-nil) before the gateway serves.
func (g *Gateway) SetTracing(t *telemetry.Tracing) {
	g.tracing = t
	if t != nil {
		g.tracer = t.Tracer
	}
}

// StopTracing exports the spans still queued (bounded by ctx); nothing with tracing off.
func (g *Gateway) StopTracing(ctx context.Context) error { return g.tracing.Shutdown(ctx) }

// genAIProvider is gen_ai.provider.name (and the older gen_ai.system): the engines speak SGLang.
const genAIProvider = "sglang"

// genAIOperation is gen_ai.operation.name for a route.
var genAIOperation = func() (op [request.Kinds]string) {
	for k := request.Kind(0); k < request.Kinds; k++ {
		op[k] = k.Path()
	}
	op[request.Chat], op[request.Messages], op[request.Responses] = "chat", "chat", "chat"
	op[request.Completions], op[request.Generate] = "text_completion", "text_completion"
	op[request.Embeddings] = "embeddings"
	return op
}()

// headerCarrier reads a fasthttp request's headers for the propagator.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string        { return []string{"traceparent", "tracestate"} }

// startSpan opens the exchange's span, the child of the client's traceparent if it sent one.
func (x *exchange) startSpan(ctx *fasthttp.RequestCtx) {
	if x.g.tracer == nil {
		return
	}
	parent := telemetry.Propagator.Extract(context.Background(), headerCarrier{&ctx.Request.Header})
	op := genAIOperation[x.kind]
	x.traceCtx, x.span = x.g.tracer.Start(parent, op, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("gen_ai.operation.name", op),
		attribute.String("gen_ai.provider.name", genAIProvider),
		attribute.String("gen_ai.system", genAIProvider),
		attribute.String("http.request.method", x.method),
		attribute.String("http.route", x.kind.Path()),
		attribute.String("client.address", x.client()),
		attribute.String("kvgate.request_id", x.rid),
	))
}

// admitted names the span once the request is known: "{operation} {model}" as GenAI's
// conventions name spans.
func (x *exchange) spanAdmitted() {
	if x.span == nil {
		return
	}
	op := genAIOperation[x.kind]
	model := ""
	if x.req != nil {
		model = x.req.Model
	}
	if model != "" {
		x.span.SetName(op + " " + model)
	}
	x.span.SetAttributes(attribute.String("gen_ai.request.model", model), attribute.String("kvgate.tenant", x.tenant.Name),
		attribute.Int("kvgate.prompt_tokens_counted", x.decision.Tokens), attribute.String("kvgate.tier", string(x.decision.Tier)))
}

// endSpan closes the exchange's span with its outcome and usage (from finish).
func (x *exchange) endSpan() {
	if x.span == nil {
		return
	}
	tenant := tenantAnonymous
	if x.tenant != nil {
		tenant = x.tenant.Name
	}
	attrs := []attribute.KeyValue{
		attribute.Int("http.response.status_code", x.status),
		attribute.String("kvgate.tenant", tenant),
		attribute.String("kvgate.model", x.model),
		attribute.String("kvgate.decision", x.reason),
	}
	if x.model != modelOther {
		attrs = append(attrs, attribute.String("gen_ai.response.model", x.model))
	}
	if x.usage != "" {
		attrs = append(attrs, attribute.Int64("gen_ai.usage.input_tokens", x.promptTokens),
			attribute.Int64("gen_ai.usage.output_tokens", x.outputTokens), attribute.String("kvgate.usage_source", x.usage))
	}
	if x.upstream != "" {
		attrs = append(attrs, attribute.String("kvgate.upstream", x.upstream))
	}
	if d := x.firstToken.Load(); d > 0 {
		attrs = append(attrs, attribute.Int64("kvgate.time_to_first_token_ns", d))
	}
	if x.errMsg != "" {
		attrs = append(attrs, attribute.String("error.type", x.errMsg))
	}
	x.span.SetAttributes(attrs...)
	if x.status >= 500 || x.status == 0 {
		x.span.SetStatus(codes.Error, x.errMsg)
	}
	if x.relayLeg != nil { // the relayed leg ends with its reply
		x.relayLeg.End()
		x.relayLeg = nil
	}
	x.span.End()
}

// startLeg opens the span of one engine leg and returns the traceparent the engine gets ("" and
// nil with tracing off).
func (x *exchange) startLeg(role string, b *backends.Backend) (string, trace.Span) {
	if x.span == nil {
		return "", nil
	}
	name := genAIOperation[x.kind]
	if x.model != "" && x.model != modelOther {
		name += " " + x.model
	}
	_, sp := x.g.tracer.Start(x.traceCtx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("gen_ai.operation.name", genAIOperation[x.kind]),
		attribute.String("gen_ai.provider.name", genAIProvider),
		attribute.String("gen_ai.system", genAIProvider),
		attribute.String("gen_ai.request.model", x.model),
		attribute.String("kvgate.leg", role),
		attribute.String("kvgate.backend", b.Name),
		attribute.String("server.address", b.Addr),
		attribute.String("kvgate.tenant", x.tenant.Name),
		attribute.String("kvgate.model", x.model),
	))
	return telemetry.Traceparent(sp.SpanContext()), sp
}

// endLeg closes a leg's span: the engine's status, or the transport error's kind.
func (x *exchange) endLeg(sp trace.Span, status int, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.SetAttributes(attribute.String("error.type", upstreamCode(0, err)))
		sp.SetStatus(codes.Error, upstreamCode(0, err))
	} else if status > 0 {
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 500 {
			sp.SetStatus(codes.Error, strconv.Itoa(status))
		}
	}
	sp.End()
}

// legRelayed notes the status of the leg whose reply the client gets; its span ends with the
// exchange's.
func (x *exchange) legRelayed(sp trace.Span, status int) {
	if sp == nil {
		return
	}
	sp.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		sp.SetStatus(codes.Error, strconv.Itoa(status))
	}
	x.relayLeg = sp
}

// prefillObserver is what the prefill leg reports to: the metrics, and with tracing its span.
func (x *exchange) prefillObserver(sp trace.Span) func(*backends.Backend, int, error) {
	if sp == nil {
		return x.g.observeUpstream
	}
	return func(b *backends.Backend, status int, err error) {
		x.g.observeUpstream(b, status, err)
		x.endLeg(sp, status, err)
	}
}
