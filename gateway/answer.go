package gateway

// The gateway's one way out: the only writer of an error reply (envelope, status, code,
// Retry-After), of an exchange's status and error code, and of the access line. A stage returns
// an *apierr.Error; it never writes one itself.

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/apierr/respond"
	"github.com/kvgate/kvgate/request"
)

// anthropicPath: errors on these routes use Anthropic's envelope.
func anthropicPath(path []byte) bool { return bytes.HasPrefix(path, []byte("/v1/messages")) }

// writeError answers with e before an exchange exists (framing, routing, utility routes):
// respond.Error, the one writer, in Anthropic's envelope on Anthropic's routes and OpenAI's
// elsewhere. An exchange answers through answer, which also records the outcome.
// Every refusal carries one X-Request-Id: those refused by fasthttp's handlers before any
// handler ran (an oversized body from its header, Expect: 100-continue) get theirs here.
func writeError(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	writeErrorIn(ctx, e, pathEnvelope(ctx.Path()))
}

// writeErrorIn is writeError in a given envelope (the path known from elsewhere).
func writeErrorIn(ctx *fasthttp.RequestCtx, e *apierr.Error, env apierr.Envelope) {
	if len(ctx.Response.Header.Peek("X-Request-Id")) == 0 {
		requestIDs(ctx)
	}
	respond.Error(ctx, e, env)
}

// pathEnvelope is the error shape of a route known only by its path (before an exchange, and
// utility exchanges, which have no generation kind): Anthropic's on Anthropic's routes.
func pathEnvelope(path []byte) apierr.Envelope {
	if anthropicPath(path) {
		return apierr.Anthropic
	}
	return apierr.OpenAI
}

// envelopeOf is the error shape of a route kind's clients.
func envelopeOf(k request.Kind) apierr.Envelope {
	switch k {
	case request.Messages:
		return apierr.Anthropic
	case request.Responses:
		return apierr.Responses
	}
	return apierr.OpenAI
}

// fromUpstream maps a failed engine call (apierr.FromUpstream); fasthttp's dial timeout says it
// timed out only in its text, so it is marked.
func fromUpstream(err error) *apierr.Error {
	if errors.Is(err, fasthttp.ErrDialTimeout) {
		err = fmt.Errorf("%w: %w", apierr.ErrUpstreamTimeout, err)
	}
	return apierr.FromUpstream(err)
}

// errorEvent ends a stream of kind with e, in the shape that route's clients read.
func errorEvent(kind request.Kind, e *apierr.Error) []byte { return e.Event(envelopeOf(kind)) }

// answer replies with e and records it for the access line (status, the logged code and, for a
// refusal, the decision). The request id is on the reply already (open).
func (x *exchange) answer(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	respond.Error(ctx, e, x.env)
	x.ended(e.Status, e.Logged())
	if e.Reason != "" {
		x.reason = e.Reason
	}
}

// replied sets the status of an engine's reply that is passed on (whole or streamed).
func (x *exchange) replied(ctx *fasthttp.RequestCtx, code int) {
	ctx.SetStatusCode(code)
	x.status = code
}

// ended records how the exchange ended where nothing more is written (a stream's headers are
// out): status 0 keeps the status already sent, code "" the code already recorded.
func (x *exchange) ended(status int, code string) {
	if status != 0 {
		x.status = status
	}
	if code != "" {
		x.errMsg = code
	}
}

// writeJSON answers a route of the gateway's own (not an exchange) with status and body.
func writeJSON(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.SetContentType("application/json")
	ctx.SetStatusCode(status)
	ctx.SetBody(body)
}

// noteDrainCut records that x was ended by the drain deadline: it answers 503 shutting_down
// (logged as such) and the drain's result names it. False while no drain is cutting.
func (x *exchange) noteDrainCut() bool {
	if !x.g.cutting.Load() {
		return false
	}
	x.ended(503, apierr.ShuttingDown().Code)
	x.g.cutMu.Lock()
	x.g.cutIDs = append(x.g.cutIDs, x.rid)
	x.g.cutMu.Unlock()
	x.g.log.Warn("request cut at the drain deadline (server.drain_timeout)", zap.String("request_id", x.rid),
		zap.String("route", x.kind.Path()), zap.String("upstream", x.upstream))
	return true
}

// finish writes the access log line and the request's metrics, and ends its span (end's last
// step).
func (x *exchange) finish() {
	g := x.g
	g.metrics.requestsC.get(x.kind.Path(), statusLabel(x.status), "").Inc()
	if x.model == "" {
		model := ""
		if x.req != nil {
			model = x.req.Model
		}
		x.model = g.metrics.models.label(model)
	}
	g.metrics.durationC.get(x.model, x.kind.Path(), "").Observe(time.Since(x.start).Seconds())
	if x.usage != "" {
		tenant := tenantAnonymous
		if x.tenant != nil {
			tenant = x.tenant.Name
		}
		g.metrics.tokensC.get(tenant, x.model, "input").Add(float64(x.promptTokens))
		g.metrics.tokensC.get(tenant, x.model, "output").Add(float64(x.outputTokens))
	}
	if ce := g.access.Check(zap.InfoLevel, "request"); ce != nil {
		tenant, model := "", ""
		if x.tenant != nil {
			tenant = x.tenant.Name
		}
		if x.req != nil {
			model = x.req.Model
		}
		fp := accessFields.Get().(*[]zap.Field)
		fields := (*fp)[:0]
		fields = append(fields, zap.String("request_id", x.rid), zap.String("engine_rid", x.engineRID), zap.String("tenant", tenant),
			zap.String("client_addr", x.client()), zap.String("method", x.method), zap.String("route", x.kind.Path()), zap.String("model", model),
			zap.Int("tokens", x.decision.Tokens), zap.String("tier", string(x.decision.Tier)), zap.String("decision", x.reason),
			zap.Int("limit", x.decision.Limit), zap.Int("status", x.status), zap.String("upstream", x.upstream),
			zap.String("error", x.errMsg), zap.Duration("latency", time.Since(x.start)))
		if x.usage != "" {
			fields = append(fields, zap.Int64("prompt_tokens", x.promptTokens), zap.Int64("completion_tokens", x.outputTokens),
				zap.String("usage", x.usage))
		}
		if d := x.firstByte.Load(); d > 0 {
			fields = append(fields, zap.Duration("ttfb", time.Duration(d)))
		}
		if d := x.firstToken.Load(); d > 0 {
			fields = append(fields, zap.Duration("ttft", time.Duration(d)))
		}
		if x.span != nil {
			fields = append(fields, zap.String("trace_id", x.span.SpanContext().TraceID().String()))
		}
		ce.Write(fields...) // encoded before it returns: the cores keep no field
		clear(fields)       // no request's strings kept alive by the pool
		*fp = fields[:0]
		accessFields.Put(fp)
	}
	x.endSpan()
}

// utilityLine is a utility call's access line and request count: its route, the model it
// named, and the engine's count of its tokens (counted < 0: none).
func (x *exchange) utilityLine(path, model string, counted int64) {
	g := x.g
	g.metrics.requests.WithLabelValues(path, statusLabel(x.status)).Inc()
	if ce := g.access.Check(zap.InfoLevel, "request"); ce != nil {
		tenant := ""
		if x.tenant != nil {
			tenant = x.tenant.Name
		}
		fields := make([]zap.Field, 0, 12)
		fields = append(fields, zap.String("request_id", x.rid), zap.String("tenant", tenant), zap.String("client_addr", x.client()),
			zap.String("method", x.method), zap.String("route", path), zap.String("model", model), zap.Int("status", x.status),
			zap.String("upstream", x.upstream), zap.Duration("latency", time.Since(x.start)))
		if counted >= 0 {
			fields = append(fields, zap.Int64("prompt_tokens", counted), zap.Int64("completion_tokens", 0), zap.String("usage", "engine"))
		}
		ce.Write(fields...)
	}
}

// accessFields are the access log line's field slices (~1.4 KB each), reused: one per request
// was the largest allocation of a small request's bookkeeping.
var accessFields = sync.Pool{New: func() any { f := make([]zap.Field, 0, 22); return &f }}

// statusLabels are the metric labels of HTTP statuses, made once.
var statusLabels = func() (l [600]string) {
	for i := range l {
		l[i] = strconv.Itoa(i)
	}
	return l
}()

func statusLabel(code int) string {
	if code >= 0 && code < len(statusLabels) {
		return statusLabels[code]
	}
	return strconv.Itoa(code)
}
