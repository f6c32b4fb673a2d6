package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/leakwatch"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tenants"
)

// exchange is one client request on its way through the chain (run), ended once (end). Each
// stage writes only its own fields; the groups below say whose they are.
type exchange struct {
	g     *Gateway
	kind  request.Kind
	env   apierr.Envelope // the error shape of the route's clients (answer)
	start time.Time
	// rid is the client-facing request id (X-Request-Id, the client's if sane); engineRID is the
	// rid the engines see, always ours.
	rid       string
	engineRID string
	tenant    *tenants.Tenant  // authenticate
	req       *request.Request // parse
	route     *backends.Route  // admit: the path chosen
	admitted                   // admit: the rest of the admission answer
	watch     *leakwatch.Watch // the request's leak detection (package leakwatch), from its marker on
	limit     *limitHold       // reserve: the tenant-limit reservation and what the reply used (quota.go)
	queued    *queued          // wait: the admission queue's KV reservation (queue.go)
	relaying                   // forward and relay: the leg, the in-flight hold
	outcome                    // what the access line says
	ending    sync.Once        // end runs once
	oh        overheadClock    // kvgate overhead (overhead.go)
	spans                      // tracing (tracing.go)
}

// admitted is admission's answer as the exchange keeps it.
type admitted struct {
	// servedModel is the configured model the request named ("" with one model: no backend
	// names one); counter counts and calibrates for it.
	servedModel string
	counter     *admission.Counter
	decision    policy.Decision
	reason      string // the access line's decision (a refusal's, once refused)
	// estimate is the raw tiktoken count when the estimate tier ran (to learn the ratio).
	estimate int
	// need is what the tenant's limits and the admission queue reserve (admission.Need).
	need admission.Need
}

// relaying is the forward's and the relay's.
type relaying struct {
	// A unified attempt's leg and rid live in the exchange (attemptUnified): the relay owns the
	// leg as it would a sent one, and releases it once.
	leg    backends.Leg
	ridOne [1]string
	// hideUsage: the engine was asked for a stream's usage that the client did not ask for;
	// the usage-only chunk is read for settlement and not relayed.
	hideUsage bool
	// holding: the route's in-flight accounting is held until end.
	holding bool
	// lastLeak is the hit that made a non-streaming reply a 502.
	lastLeak *canary.Hit
}

// outcome is what the access line and the metrics say of the exchange: the client's address and
// the method, read when the request arrived (fasthttp reuses its RequestCtx); status and error
// code (written by answer.go only); the times from start to the first bytes of a streamed reply
// handed to the client and to its first event carrying generated text (ns, 0: none); the tokens
// settled (usage: "" when nothing was produced).
type outcome struct {
	clientAddr   net.Addr // the connection's own (fasthttp keeps it for the connection's life)
	method       string
	status       int
	errMsg       string
	upstream     string
	firstByte    atomic.Int64
	firstToken   atomic.Int64
	usage        string
	promptTokens int64
	outputTokens int64
	// model is the metrics' model label (modelLabels): the route's advertised model, set when
	// the request is forwarded; at the end, the request's own when it names an advertised one.
	model string
}

// spans are the exchange's tracing (tracing.go): nil while tracing is off. relayLeg is the span
// of the engine leg whose reply is relayed; it ends with the exchange's.
type spans struct {
	traceCtx context.Context
	span     trace.Span
	relayLeg trace.Span
}

// generate serves the generation routes: one exchange, its chain run, and its one end (a
// streamed reply ends in the relay's Close instead, when the client has it all).
func (g *Gateway) generate(ctx *fasthttp.RequestCtx, kind request.Kind) {
	x := &exchange{g: g, start: time.Now(), kind: kind, env: envelopeOf(kind)}
	x.clientAddr, x.method = ctx.RemoteAddr(), methodName(ctx.Method())
	x.rid, x.engineRID = requestIDs(ctx)
	defer x.recoverPanic(ctx)
	x.startSpan(ctx)
	if e := x.run(ctx); e != nil {
		x.fail(ctx, e)
	}
}

// run is the chain, top to bottom: authenticate, parse and admit (admit), reserve the tenant's
// limits, wait for free KV, then forward (which ends the exchange through the relay). Each stage
// reads what earlier ones left, writes only its own fields, and returns nil or the client's
// error. The limits and the queue both reserve the admission Need and read nothing of each
// other: putting the queue first is a swap of the two calls.
func (x *exchange) run(ctx *fasthttp.RequestCtx) *apierr.Error {
	if e := x.admit(ctx); e != nil {
		return e
	}
	x.spanAdmitted()
	if e := x.reserveLimits(ctx); e != nil { // 429 after the 413 decision, before any backend (quota.go)
		return e
	}
	if e := x.enqueue(ctx); e != nil { // waits for free KV (queue.go)
		return e
	}
	x.watch.Forwarding(x.route, x.counter.Encoder)
	x.g.forward(ctx, x)
	return nil
}

// end ends the exchange, once, on every way out, in this order: the route's in-flight hold is
// released, the tenant's limits settled from what the reply used, the engine's prompt count held
// against admission's (drift), the queue's KV released and its charge corrected from the settled
// usage, the leak watch closed, and the access line written.
func (x *exchange) end() {
	x.ending.Do(func() {
		x.release()
		if engine, admitted, ok := x.settleLimits(); ok {
			x.g.drift.observe(x, engine, admitted)
		}
		x.releaseQueue()
		x.watch.Done()
		x.finish()
	})
}

// recoverPanic, deferred by generate, ends an exchange that panicked as a 500 in its route's
// envelope (writeError's body reset closes a stream relay had set up), and still closes it (in-flight accounting released, limits settled, logged).
func (x *exchange) recoverPanic(ctx *fasthttp.RequestCtx) {
	v := recover()
	if v == nil {
		return
	}
	panics.Note(x.g.log, "request", v)
	ctx.SetConnectionClose()
	defer panics.Recover(x.g.log, "request_close")
	x.fail(ctx, apierr.Internal)
}

// fail answers with e and ends the exchange.
func (x *exchange) fail(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	x.answer(ctx, e)
	x.end()
}

// admit runs everything up to the decision. A nil result means forward along x.route.
func (x *exchange) admit(ctx *fasthttp.RequestCtx) *apierr.Error {
	g := x.g
	x.tenant = g.authenticate(ctx)
	if x.tenant == nil {
		return apierr.Unauthorized
	}
	body, e := readBody(ctx, g.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	req, e := request.Parse(x.kind, body)
	if e != nil {
		return e
	}
	x.req = req
	sent := 0 // the prompt's bytes as sent, before the marker goes in (Begin) and the template
	if x.tenant.MaxPromptBytes > 0 {
		sent = promptBytes(req)
	}
	models := g.modelTab() // one table for the whole decision, whatever a reload does meanwhile
	if x.servedModel, e = models.resolve(x.kind, req.Model, modelHasField(x.kind)); e != nil {
		return e
	}
	x.counter = models.counter(x.servedModel)
	if len(req.ModelSwitches()) > 0 {
		if e := req.CheckTemplateSwitches(models.acceptsSwitch(x.servedModel)); e != nil {
			return e
		}
	}
	if req.StoredContext != "" && !g.pol().AllowStoredContext {
		return request.StoredContextError(req.StoredContext)
	}
	x.watch = g.watch.Begin(x.rid, x.engineRID, x.tenant, x.kind, req) // before counting: the marker is part of the prompt
	req.Render()
	if tpl := models.template(x.servedModel); tpl != nil {
		if e := req.RenderTemplate(tpl); e != nil {
			return e
		}
	}
	if e := req.CountImages(models.imageRule(x.servedModel), models.remoteAtMax[x.servedModel]); e != nil {
		return e
	}
	routes, err := g.routesFor(x.servedModel)
	if err != nil {
		return routeError(err)
	}
	if x.kind.UnifiedOnly() {
		if routes = unifiedRoutes(routes); len(routes) == 0 {
			return &apierr.Error{Status: 503, Type: "server_error", Code: "no_backend", RetryAfter: 5,
				Message: fmt.Sprintf("No unified engine is available for %s (prefill-only routes do not run on prefill/decode pairs).", x.kind.Path())}
		}
	}
	pol := g.pol()
	ans := x.counter.Decide(admission.Ask{Kind: x.kind, Prompts: req.Prompts, Output: req.Output, OutputGiven: req.OutputGiven, N: req.N,
		Routes: routes, DefaultMaxTokens: pol.DefaultMaxTokens, TenantMaxPrompt: x.tenant.MaxPromptTokens,
		TenantMaxPromptBytes: x.tenant.MaxPromptBytes, PromptBytes: sent,
		FailClosed: g.drift.failClosed(x.servedModel), FailClosedModel: flagName(x.servedModel), FailClosedRetryAfter: failClosedRetryAfter,
		Monitor: pol.Mode == config.ModeMonitor, OverflowStatus: pol.OverflowStatus})
	x.decision, x.estimate, x.reason, x.route, x.need = ans.Decision, ans.Estimate, ans.Reason, ans.Route, ans.Need
	g.metrics.admitSeconds.Observe(time.Since(x.start).Seconds())
	if ans.Reason != admission.ReasonTenantMaxPromptBytes { // refused before any counting: no count to tell
		ctx.Response.Header.Set("X-Kvgate-Tier", string(x.decision.Tier))
		var nb [20]byte
		ctx.Response.Header.SetBytesV("X-Kvgate-Tokens", strconv.AppendInt(nb[:0], int64(x.decision.Tokens), 10))
	}
	g.metrics.decisionsC.get(ans.Verdict, x.reason, string(x.decision.Tier)).Inc()
	if ans.Verdict == admission.VerdictMonitorPass {
		ctx.Response.Header.Set("X-Kvgate-Monitor", "would-refuse: "+x.reason)
		g.log.Warn("monitor mode: forwarding a request the admission rule refuses",
			zap.String("request_id", x.rid), zap.String("tenant", x.tenant.Name), zap.Int("tokens", x.decision.Tokens), zap.Int("limit", x.decision.Limit))
	}
	return ans.Refusal
}

// promptFields are the body fields that carry a route's prompt (tools are rendered into it).
var promptFields = [request.Kinds][]string{
	request.Chat: {"messages", "tools"}, request.Completions: {"prompt", "suffix"}, request.Generate: {"text", "input_ids"},
	request.Responses: {"instructions", "input", "tools"}, request.Messages: {"system", "messages", "tools"},
	request.Embeddings: {"input"}, request.Rerank: {"query", "documents"}, request.Score: {"query", "items"},
	request.Classify: {"input"}, request.Encode: {"text", "input_ids"}, request.ClassifyNative: {"text", "input_ids"},
}

// promptBytes is what max_prompt_bytes holds against: the JSON of the prompt's fields as the
// client sent them (every prompt of a batch together), before template and marker.
func promptBytes(req *request.Request) int {
	n := 0
	for _, f := range promptFields[req.Kind] {
		n += len(req.Fields[f])
	}
	return n
}

// client is the client's address, formatted when a log line or span needs it.
func (x *exchange) client() string {
	if x.clientAddr == nil {
		return ""
	}
	return x.clientAddr.String()
}

// methodName is m as a string, without allocating for the methods routes take.
func methodName(m []byte) string {
	switch string(m) {
	case fasthttp.MethodPost:
		return fasthttp.MethodPost
	case fasthttp.MethodGet:
		return fasthttp.MethodGet
	}
	return string(m)
}

// tenantAnonymous is the tenant label of what no key identified.
const tenantAnonymous = "anonymous"

// readBody reads the request body, refusing more than maxBytes with 413 (not fasthttp's 400).
func readBody(ctx *fasthttp.RequestCtx, maxBytes int) ([]byte, *apierr.Error) {
	if cl := ctx.Request.Header.ContentLength(); cl > maxBytes {
		ctx.SetConnectionClose() // the rest of the body is not read
		return nil, apierr.TooLarge(maxBytes)
	}
	s := ctx.RequestBodyStream()
	if s == nil {
		// fasthttp reuses PostBody once the handler returns; the parsed request keeps slices of
		// the body (request.Parse), and a stream outlives the handler: a copy of our own.
		return append([]byte(nil), ctx.PostBody()...), nil
	}
	var body []byte
	var err error
	if cl := ctx.Request.Header.ContentLength(); cl >= 0 {
		// A declared length (within maxBytes, above): read exactly it, into one buffer of its
		// size; fasthttp's stream ends there.
		body = make([]byte, cl)
		_, err = io.ReadFull(s, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(s, int64(maxBytes)+1))
	}
	if err != nil {
		// The read error names the connection's addresses: it goes nowhere near the client.
		ctx.SetConnectionClose()
		// fasthttp's ErrBrokenChunk hides the cause from errors.As; its text still says it.
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() || strings.HasSuffix(err.Error(), "i/o timeout") {
			return nil, apierr.RequestTimeout
		}
		return nil, apierr.BadRequest("", "Could not read the request body.")
	}
	if len(body) > maxBytes {
		ctx.SetConnectionClose()
		return nil, apierr.TooLarge(maxBytes)
	}
	return body, nil
}

// unifiedRoutes keeps the routes served by one unified engine.
func unifiedRoutes(routes []backends.Route) []backends.Route {
	var out []backends.Route
	for _, r := range routes {
		if r.Unified != nil {
			out = append(out, r)
		}
	}
	return out
}
