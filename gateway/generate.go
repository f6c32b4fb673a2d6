package gateway

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/policy"
)

// exchange is one client request on its way through the pipeline; the access log line is
// written from it once the reply is complete (for streams, when the stream closes).
type exchange struct {
	g      *Gateway
	tenant *tenant
	req    *request
	// rid is the client-facing request id (X-Request-Id, the client's if sane); engineRID is the
	// rid the engines see, always ours.
	rid       string
	engineRID string
	// lastLeak is the hit that made a non-streaming reply a 502.
	lastLeak *canary.Hit
	start    time.Time
	kind     routeKind
	decision policy.Decision
	reason   string
	// estimate is the raw tiktoken count when the estimate tier ran (to learn the ratio).
	estimate int
	route    *backends.Route
	// echoes are foreign markers the client's own prompt contained.
	echoes   []string
	status   int
	upstream string
	errMsg   string
	logged   atomic.Bool
	limit    *limitHold // kvgate limits: the tenant-limit reservation, settled in finish

	oh overheadClock // kvgate overhead (overhead.go)
}

// generate is the pipeline for the three generation routes, top to bottom:
// auth → read body → parse and sanitize → render → count and decide → pick a route → forward.
func (g *Gateway) generate(ctx *fasthttp.RequestCtx, kind routeKind) {
	x := &exchange{g: g, rid: requestID(ctx), engineRID: newID(), start: time.Now(), kind: kind}
	ctx.Response.Header.Set("X-Request-Id", x.rid)
	if e := x.admit(ctx); e != nil {
		x.fail(ctx, e)
		return
	}
	if e := x.reserveLimits(); e != nil { // kvgate limits: 429 after the 413 decision, before any backend
		x.fail(ctx, e)
		return
	}
	g.forward(ctx, x)
}

// fail answers with e and logs the exchange.
func (x *exchange) fail(ctx *fasthttp.RequestCtx, e *apiError) {
	writeError(ctx, e)
	ctx.Response.Header.Set("X-Request-Id", x.rid)
	x.status, x.errMsg = e.Status, e.Code
	x.finish()
}

// admit runs everything up to the decision. A nil result means forward along x.route.
func (x *exchange) admit(ctx *fasthttp.RequestCtx) *apiError {
	g := x.g
	x.tenant = g.authenticate(ctx)
	if x.tenant == nil {
		return errUnauthorized
	}
	body, e := readBody(ctx, g.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	req, e := parseRequest(x.kind, body)
	if e != nil {
		return e
	}
	x.req = req
	x.inject() // before counting: the marker is part of the prompt
	req.render()
	output := req.output
	if !req.outputGiven {
		output = g.cfg.Policy.DefaultMaxTokens * max(req.n, 1)
	}
	routes, err := g.backends.Routes(time.Now())
	if err != nil {
		return routeError(err)
	}
	paths := make([]policy.Path, len(routes))
	for i := range routes {
		paths[i] = routes[i].Path
	}
	tenantMax := x.tenant.MaxPromptTokens
	limit := policy.Limit(paths, output, tenantMax)
	x.decision = x.decide(limit)
	dur := time.Since(x.start)
	g.metrics.admitSeconds.Observe(dur.Seconds())
	ctx.Response.Header.Set("X-Kvgate-Tier", string(x.decision.Tier))
	ctx.Response.Header.Set("X-Kvgate-Tokens", strconv.Itoa(x.decision.Tokens))
	if !x.decision.Admit {
		x.reason = "context_length_exceeded"
		if tenantMax > 0 && x.decision.Tokens <= policy.Limit(paths, output, 0) {
			x.reason = "tenant_max_prompt_tokens"
		}
		if g.cfg.Policy.Mode != "monitor" {
			g.metrics.decisions.WithLabelValues("refuse", x.reason, string(x.decision.Tier)).Inc()
			return x.tooLong(routes, output, limit)
		}
		// monitor: log and count the refusal, then serve on the roomiest route.
		g.metrics.decisions.WithLabelValues("monitor_pass", x.reason, string(x.decision.Tier)).Inc()
		ctx.Response.Header.Set("X-Kvgate-Monitor", "would-refuse: "+x.reason)
		g.log.Warn("monitor mode: forwarding a request the admission rule refuses",
			zap.String("request_id", x.rid), zap.String("tenant", x.tenant.Name), zap.Int("tokens", x.decision.Tokens), zap.Int("limit", limit))
		best := 0
		for i := range routes {
			if policy.MaxPrompt(routes[i].Path, output, tenantMax) > policy.MaxPrompt(routes[best].Path, output, tenantMax) {
				best = i
			}
		}
		x.route = &routes[best]
		return nil
	}
	x.reason = "ok"
	g.metrics.decisions.WithLabelValues("admit", x.reason, string(x.decision.Tier)).Inc()
	// Least-loaded route among those that admit this prompt.
	var pick *backends.Route
	for _, i := range policy.Eligible(paths, x.decision.Tokens, output, tenantMax) {
		if r := &routes[i]; pick == nil || r.Load() < pick.Load() {
			pick = r
		}
	}
	x.route = pick
	return nil
}

// decide counts every prompt of the request (a batch has several) against limit. The request
// is admitted only if all fit; the decision reported is the largest prompt's.
func (x *exchange) decide(limit int) policy.Decision {
	g := x.g
	var exact policy.ExactCounter // a nil *exactCounter must stay a nil interface
	if g.exact != nil {
		exact = g.exact
	}
	var worst policy.Decision
	for i, p := range x.req.prompts {
		pr := policy.Request{Text: p.text, Bytes: len(p.text), InputIDs: p.ids, HasInputIDs: p.hasIDs,
			Overhead: specialTokenAllowance, DistrustEstimate: g.distrustEstimate.Load()}
		est := &recordingEstimator{Estimator: g.enc}
		d := policy.Decide(context.Background(), pr, limit, est, g.ratio.Get(), exact)
		if est.n > x.estimate {
			x.estimate = est.n
		}
		if i == 0 || !d.Admit && worst.Admit || d.Admit == worst.Admit && d.Tokens > worst.Tokens {
			worst = d
		}
	}
	return worst
}

// specialTokenAllowance covers tokens an engine adds to a text prompt (BOS, EOS) that are not
// in the text: the byte bound is only sound with them added.
const specialTokenAllowance = 2

// recordingEstimator remembers the last estimate (to learn the safety ratio from engine reports).
type recordingEstimator struct {
	policy.Estimator
	n int
}

func (r *recordingEstimator) Count(text string, stopAfter int) (int, bool) {
	n, complete := r.Estimator.Count(text, stopAfter)
	if complete {
		r.n = n
	}
	return n, complete
}

// tooLong is the 413: OpenAI's wording on OpenAI routes, SGLang's on /generate.
func (x *exchange) tooLong(routes []backends.Route, output, limit int) *apiError {
	ctxLen := 0
	for _, r := range routes {
		ctxLen = max(ctxLen, r.ContextLen)
	}
	limit = max(limit, 0)
	n := x.decision.Tokens
	e := &apiError{Status: 413, Type: "invalid_request_error", Code: "context_length_exceeded"}
	switch x.kind {
	case routeChat:
		e.Param = "messages"
	case routeCompletions:
		e.Param = "prompt"
	default:
		e.Param = "text"
	}
	if x.reason == "tenant_max_prompt_tokens" {
		e.Message = fmt.Sprintf("Your prompt resulted in %d tokens, more than this API key's limit of %d prompt tokens. Please reduce the length of the prompt.", n, x.tenant.MaxPromptTokens)
		return e
	}
	reserve := ""
	if output > 0 {
		reserve = fmt.Sprintf(", leaving room for the %d completion tokens requested", output)
	}
	switch x.kind {
	case routeGenerate:
		e.Message = fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens%s). Use a shorter input.", n, limit, reserve)
	case routeCompletions:
		e.Message = fmt.Sprintf("This model's maximum context length is %d tokens. However, your prompt resulted in %d tokens. Please reduce the length of the prompt. (The engines accept at most %d prompt tokens now%s.)", ctxLen, n, limit, reserve)
	default:
		e.Message = fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages. (The engines accept at most %d prompt tokens now%s.)", ctxLen, n, limit, reserve)
	}
	return e
}

// readBody reads the request body, refusing more than maxBytes with 413 (not fasthttp's 400).
func readBody(ctx *fasthttp.RequestCtx, maxBytes int) ([]byte, *apiError) {
	if cl := ctx.Request.Header.ContentLength(); cl > maxBytes {
		ctx.SetConnectionClose() // the rest of the body is not read
		return nil, tooLarge(maxBytes)
	}
	s := ctx.RequestBodyStream()
	if s == nil {
		return ctx.PostBody(), nil
	}
	body, err := io.ReadAll(io.LimitReader(s, int64(maxBytes)+1))
	if err != nil {
		return nil, badRequest("", "Could not read the request body: "+err.Error())
	}
	if len(body) > maxBytes {
		ctx.SetConnectionClose()
		return nil, tooLarge(maxBytes)
	}
	return body, nil
}

// finish writes the access log line once.
func (x *exchange) finish() {
	if x.logged.Swap(true) {
		return
	}
	x.settleLimits() // kvgate limits: settle the reservation from what the reply used
	g := x.g
	g.metrics.requests.WithLabelValues(x.kind.path(), strconv.Itoa(x.status)).Inc()
	if ce := g.access.Check(zap.InfoLevel, "request"); ce != nil {
		tenant := ""
		if x.tenant != nil {
			tenant = x.tenant.Name
		}
		ce.Write(zap.String("request_id", x.rid), zap.String("engine_rid", x.engineRID), zap.String("tenant", tenant), zap.String("route", x.kind.path()),
			zap.Int("tokens", x.decision.Tokens), zap.String("tier", string(x.decision.Tier)), zap.String("decision", x.reason),
			zap.Int("limit", x.decision.Limit), zap.Int("status", x.status), zap.String("upstream", x.upstream),
			zap.String("error", x.errMsg), zap.Duration("latency", time.Since(x.start)))
	}
}
