package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unsafe"

	json "github.com/goccy/go-json"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
)

// This file sends an admitted request along its route (one attempt per method, cleanup
// deferred) and writes the engine's whole replies; relay.go streams. Everything that speaks
// SGLang's wire protocol (bodies with rids and bootstrap fields, legs, aborts) is in backends.

func retryable(code int) bool { return code == 408 || code == 429 || code >= 500 }

// engineFields are what an engine gets in place of (or besides) the client's fields: the stream
// usage option and our cache salt. Written over the client's fields by backends.EngineBodyWith,
// without copying them.
func (x *exchange) engineFields(f []backends.Field) []backends.Field {
	if opts, ok := x.usageStreamOptions(); ok {
		f = append(f, backends.Field{Key: "stream_options", Value: opts}) // kvgate limits
	}
	if !x.kind.Generates() || x.g.pol().SharePrefixCache {
		return f
	}
	// Tenants never share prefix-cache entries: whatever the client sent is replaced. Every
	// request is salted, with or without a marker in its prompt: /generate with input_ids and
	// canary opt-out tenants carry none, and a shared cached prefix answers faster, which tells
	// one tenant what another sent.
	if x.kind != request.Generate {
		return append(f, backends.Field{Key: "cache_salt", Value: x.tenant.CacheSaltJSON()})
	}
	salt := x.tenant.CacheSalt()
	// The native /generate names the salt extra_key (SGLang's OpenAI routes turn cache_salt into
	// it); a batch gets one per item, as its rids. Versions without the field ignore it: see
	// SECURITY.md.
	if x.req.Batch {
		salts := make([]string, len(x.req.Prompts))
		for i := range salts {
			salts[i] = salt
		}
		return append(f, backends.Field{Key: "extra_key", Value: jsonOf(salts)})
	}
	return append(f, backends.Field{Key: "extra_key", Value: quoted(salt)})
}

// quoted is s as a JSON string; s is hex (no escaping needed).
func quoted(s string) json.RawMessage {
	b := make([]byte, 0, len(s)+2)
	return append(append(append(b, '"'), s...), '"')
}

// usageStreamOptions: every chat or completions stream is asked for its usage (OpenAI's
// stream_options.include_usage: one last chunk with usage and no choices), so it is charged and
// counted (kvgate_tokens_total) as the engine counted rather than by our prompt bound, a loose
// upper bound (~3× a short prompt). A client that did not ask never sees that chunk (hideUsage).
func (x *exchange) usageStreamOptions() (json.RawMessage, bool) {
	if !x.req.Stream || x.kind != request.Chat && x.kind != request.Completions {
		return nil, false
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := x.req.Fields["stream_options"]; ok && string(bytes.TrimSpace(raw)) != "null" {
		if json.Unmarshal(raw, &opts) != nil {
			return nil, false // the engine answers the client's own error
		}
	}
	var asked bool
	if raw, ok := opts["include_usage"]; ok && json.Unmarshal(raw, &asked) == nil && asked {
		return nil, false
	}
	opts["include_usage"] = json.RawMessage("true")
	x.hideUsage = true
	b, err := json.Marshal(opts)
	return b, err == nil
}

// jsonOf is v encoded; only for values that always encode (strings, string slices).
func jsonOf(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// hold accounts the request's tokens as in flight on every backend of its route, until close.
func (x *exchange) hold() {
	for _, b := range x.route.All() {
		b.AddInflight(x.decision.Tokens)
	}
	x.holding = true
}

// release gives back the in-flight hold (end's first step).
func (x *exchange) release() {
	if x.holding {
		for _, b := range x.route.All() {
			b.AddInflight(-x.decision.Tokens)
		}
	}
}

// forward sends the admitted request along x.route and relays the reply: one attempt on a
// unified engine; on a PD pair, attempts until one is final (retries only before any byte
// reached the client).
func (g *Gateway) forward(ctx *fasthttp.RequestCtx, x *exchange) {
	x.model = g.metrics.models.label(routeModel(x.route))
	if x.servedModel != "" {
		x.model = x.servedModel // a configured model (bounded by the file): the label clients know it by
	}
	x.hold()
	if x.route.Unified != nil {
		x.upstream = x.route.Unified.Name
		x.attemptUnified(ctx)
		return
	}
	x.upstream = x.route.Prefill.Name + "+" + x.route.Decode.Name
	for attempt := 0; !x.attemptPD(ctx, attempt, attempt >= g.cfg.Upstream.Retries); attempt++ {
	}
}

// failUpstream answers a failed upstream call through the one error mapping; the detail goes to
// the log only.
func (x *exchange) failUpstream(ctx *fasthttp.RequestCtx, b *backends.Backend, err error) {
	if x.noteDrainCut() {
		x.fail(ctx, apierr.ShuttingDown())
		return
	}
	x.g.log.Warn("engine call failed", zap.String("request_id", x.rid), zap.String("backend", b.Name), zap.Error(err))
	x.fail(ctx, fromUpstream(err))
}

func (x *exchange) attemptUnified(ctx *fasthttp.RequestCtx) {
	b := x.route.Unified
	rids := x.ridOne[:] // the exchange's own: one try, one rid
	if x.req.Batch {
		rids = backends.Rids(x.engineRID, true, len(x.req.Prompts))
	} else {
		rids[0] = x.engineRID
	}
	var fb [4]backends.Field // the engine's own fields, on the stack: EngineBodyWith copies them
	body := backends.EngineBodyWith(x.req.Fields, x.engineFields(fb[:0]), rids, x.req.Batch, nil)
	traceparent, leg := x.startLeg("unified", b)
	x.ohSent() // kvgate overhead
	l := &x.leg
	err := b.SendInto(l, x.kind.Path(), body, rids, x.engineRID, traceparent, x.req.Stream)
	x.ohHeaders() // kvgate overhead
	x.g.countUpstream(b, l, err)
	if err != nil {
		x.endLeg(leg, 0, err)
		x.failUpstream(ctx, b, err)
		return
	}
	x.legRelayed(leg, l.Status())
	x.relay(ctx, l, nil)
	x.ohReplied() // kvgate overhead
}

// attemptPD is one try on a PD pair: the same body to both legs, decode's reply relayed once
// prefill succeeded too. It returns false when another try should follow; every leg it does not
// hand to the relay is released (and its engines told to abort) on the way out.
func (x *exchange) attemptPD(ctx *fasthttp.RequestCtx, attempt int, last bool) (final bool) {
	p, d := x.route.Prefill, x.route.Decode
	base := x.engineRID
	if attempt > 0 {
		base += "-r" + strconv.Itoa(attempt)
	}
	rids := backends.Rids(base, x.req.Batch, len(x.req.Prompts))
	var fb [4]backends.Field
	body := backends.EngineBodyWith(x.req.Fields, x.engineFields(fb[:0]), rids, x.req.Batch, p) // a new room on every try
	ptp, psp := x.startLeg("prefill", p)
	pf := p.StartPrefill(x.kind.Path(), body, rids, base, ptp, x.prefillObserver(psp))
	decodeAnswered := make(chan struct{})
	backends.AbortWhenPrefillFails(d, rids, pf, decodeAnswered)
	dtp, dsp := x.startLeg("decode", d)
	x.ohSent() // kvgate overhead
	dl, err := d.Send(x.kind.Path(), body, rids, base, dtp, x.req.Stream)
	x.ohHeaders() // kvgate overhead
	close(decodeAnswered)
	x.g.countUpstream(d, dl, err)
	handed := false
	decodeStatus, decodeSpanOpen := 0, dsp != nil
	if err == nil {
		decodeStatus = dl.Status()
	}
	defer func() {
		if dl != nil && !handed {
			dl.Release()
		}
		if decodeSpanOpen { // a try given up: its decode leg's span ends here
			x.endLeg(dsp, decodeStatus, err)
		}
	}()
	relayed := func() { // the decode leg's span ends with the exchange's
		if decodeSpanOpen {
			x.legRelayed(dsp, decodeStatus)
			decodeSpanOpen = false
		}
	}
	if err != nil {
		abort(p, rids, nil) // a transport error on one leg cancels the other
		if !last {
			return false
		}
		x.failUpstream(ctx, d, err)
		return true
	}
	if code := dl.Status(); code < 200 || code > 299 {
		abort(p, rids, nil)
		if retryable(code) && !last {
			return false
		}
		handed = true
		relayed()
		x.relay(ctx, dl, nil) // decode's error first: passed on, scanned
		return true
	}
	// Decode accepted. The request only succeeded if prefill did too.
	select {
	case <-pf.Done:
	case <-time.After(x.g.cfg.Upstream.ResponseHeaderTimeout):
		abort(p, rids, d)
		if !last {
			return false
		}
		x.failUpstream(ctx, p, apierr.ErrPrefillTimeout)
		return true
	}
	if !pf.OK() {
		abort(d, rids, nil)
		if (pf.Err != nil || retryable(pf.Status)) && !last {
			return false
		}
		if pf.Err != nil {
			x.failUpstream(ctx, p, pf.Err)
			return true
		}
		// The engine's own error, with its status (scanned like any reply).
		x.ended(0, "prefill_failed")
		c := x.g.replies.NewCharge()
		if !c.Reserve(config.ReplyCostFactor * int64(len(pf.Body))) {
			x.overBudget(ctx, p)
		} else if !x.writeEngineReply(ctx, pf.Status, pf.ContentType, pf.Body, p, c, x.watch.Guard()) {
			x.cut(x.lastLeak, p, rids, d)
		}
		c.Done() // at most 1 MiB: given back at once (the body stream's Close is then a no-op)
		x.end()
		return true
	}
	handed = true
	relayed()
	x.ohHeaders() // kvgate overhead: prefill's answer was engine time too
	x.relay(ctx, dl, p)
	x.ohReplied() // kvgate overhead
	return true
}

func (g *Gateway) observeUpstream(b *backends.Backend, status int, err error) {
	g.metrics.upstreamC.get(b.Name, upstreamCode(status, err), "").Inc()
}

func (g *Gateway) countUpstream(b *backends.Backend, l *backends.Leg, err error) {
	status := 0
	if err == nil {
		status = l.Status()
	}
	g.observeUpstream(b, status, err)
}

// relay writes the engine's reply to the client, normalised and scanned (reply.go): a 2xx reply
// to a streaming request is read as an event stream whatever its content type, event by event;
// anything else is read whole (bounded) as one JSON value. The relay owns l from here. other is
// the PD peer's backend, aborted too if the reply is cut or the client goes away mid-stream.
func (x *exchange) relay(ctx *fasthttp.RequestCtx, l *backends.Leg, other *backends.Backend) {
	code := l.Status()
	gd := x.watch.Guard() // one scanner state for the reply's headers and body
	if h := x.scanHeaders(l, gd); h != nil {
		// A marker in a header is a leak like one in the body, though no header is passed on.
		defer x.closeLeg(l)
		x.lastLeak = h
		x.answer(ctx, apierr.UpstreamIntegrity())
		x.cut(h, l.B, l.Rids, other)
		return
	}
	copyReplyHeaders(ctx, l) // X-Request-Id is set already (generate)
	if code >= 200 && code <= 299 && code != 204 && x.req.Stream {
		body := l.Body()
		src, err := reply.Decoded(string(l.Header(fasthttp.HeaderContentEncoding)), body)
		if cs := reply.CharsetOf(l.ContentType()); err == nil && cs != "" && cs != "utf-8" && cs != "utf8" {
			err = fmt.Errorf("%w %q on an event stream (the format is UTF-8 only)", reply.ErrCharset, cs)
		}
		if err != nil {
			defer x.closeLeg(l)
			abort(l.B, l.Rids, other)
			x.upstreamError(ctx, "upstream_unreadable", fmt.Errorf("engine %s: %w", l.B.Name, err))
			return
		}
		x.replied(ctx, code)
		ctx.Response.ImmediateHeaderFlush = true
		ctx.Response.Header.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.SetBodyStream(x.newRelayReader(l, other, src, src == body, gd), -1)
		return
	}
	defer x.closeLeg(l)
	if code < 200 || code == 204 || code == 304 {
		// An engine never answers a generation request like this: something else is there.
		abort(l.B, l.Rids, nil)
		x.upstreamError(ctx, "upstream_error", fmt.Errorf("engine %s answered %d with no reply body", l.B.Name, code))
		return
	}
	src, err := reply.Decoded(string(l.Header(fasthttp.HeaderContentEncoding)), l.Body())
	if err != nil {
		abort(l.B, l.Rids, nil)
		x.upstreamError(ctx, "upstream_unreadable", fmt.Errorf("engine %s: %w", l.B.Name, err))
		return
	}
	charge := x.g.replies.NewCharge()
	// Given back when the client has the output (reply.ChargedBody) or, on every other way out, here;
	// done is once-only, so the later of the two gives nothing twice.
	defer func() {
		if !ctx.Response.IsBodyStream() {
			charge.Done()
		}
	}()
	declared := -1
	if len(l.Header(fasthttp.HeaderContentEncoding)) == 0 {
		declared = l.ContentLength()
	}
	body, err := reply.ReadWhole(src, declared, x.g.cfg.Upstream.MaxReplyBytes, charge)
	if err != nil {
		abort(l.B, l.Rids, other)
		if errors.Is(err, reply.ErrBudget) {
			x.overBudget(ctx, l.B)
			return
		}
		x.upstreamError(ctx, "upstream_error", fmt.Errorf("engine %s: reading the reply: %w", l.B.Name, err))
		return
	}
	if !x.writeEngineReply(ctx, code, l.ContentType(), body, l.B, charge, gd) {
		x.cut(x.lastLeak, l.B, l.Rids, other)
	} else if x.errMsg == "reply_over_budget" {
		abort(l.B, l.Rids, other)
	}
}

// closeLeg releases a leg the relay owns and ends the exchange.
func (x *exchange) closeLeg(l *backends.Leg) {
	l.Release()
	x.end()
}

// scanHeaders looks for foreign markers in every header of an engine's reply (names and
// values): headers are text an engine sends, whether or not they are passed on.
func (x *exchange) scanHeaders(l *backends.Leg, gd *reply.Guard) *canary.Hit {
	if gd == nil {
		return nil
	}
	var leak *canary.Hit
	// One buffer for every header line, from a pool: ScanText only reads it, and it goes back
	// when the scan returns.
	bp := headerLines.Get().(*[]byte)
	line := *bp
	for k, v := range l.Headers() {
		line = append(append(append(line[:0], k...), ": "...), v...)
		leak = gd.ScanText(unsafe.String(unsafe.SliceData(line), len(line))) // sticky: the first hit stays
	}
	if cap(line) <= maxPooledHeaderLine {
		*bp = line[:0]
		headerLines.Put(bp)
	}
	return leak
}

// headerLines are scanHeaders' line buffers; one grown past maxPooledHeaderLine (an engine's
// huge header) is left to the collector.
var headerLines = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledHeaderLine = 16 << 10

// upstreamError answers 502 with a generic message; the detail (backend names, addresses,
// transport errors) goes only to the log.
func (x *exchange) upstreamError(ctx *fasthttp.RequestCtx, code string, detail error) {
	if x.noteDrainCut() {
		x.answer(ctx, apierr.ShuttingDown())
		return
	}
	x.g.log.Warn("engine reply refused", zap.String("request_id", x.rid), zap.String("error_code", code), zap.Error(detail))
	x.answer(ctx, apierr.UpstreamFailed("The engine's reply could not be used.").LoggedAs(code))
}

// writeEngineReply passes an engine's whole reply on with its status, normalised and scanned
// (normaliseBody). It returns false when the scan found a foreign marker: the client then gets a
// 502 instead. A reply that is not JSON is never passed on (a client could decode it some other
// way): the client gets an error of our own. Every step is charged to c
// (upstream.max_buffered_bytes); a reply that does not fit gets 503 (x.errMsg
// "reply_over_budget"), and the caller aborts its engine request.
func (x *exchange) writeEngineReply(ctx *fasthttp.RequestCtx, code int, contentType []byte, body []byte, b *backends.Backend, c *reply.Charge, gd *reply.Guard) bool {
	// v holds only what usage is read from; out may be body itself (passed on as it came),
	// otherwise the body is garbage from here: nothing may keep it alive.
	out, v, leak, err := reply.BodyUsage(gd, contentType, body, c)
	body = nil
	if code >= 200 && code <= 299 {
		x.noteUsage(v) // kvgate limits: the reply as decoded (nil when it is refused)
	}
	switch {
	case errors.Is(err, reply.ErrBudget):
		x.overBudget(ctx, b)
		return true
	case errors.Is(err, reply.ErrLeak):
		x.lastLeak = leak
		x.answer(ctx, apierr.UpstreamIntegrity())
		return false
	case err != nil:
		x.g.log.Warn("engine reply refused: not JSON, or indexes a client would merge differently", zap.String("request_id", x.rid), zap.String("backend", b.Name),
			zap.Int("status", code), zap.Error(err))
		e := apierr.UpstreamFailed("The engine's reply could not be used.")
		if code >= 400 && code <= 499 {
			e = &apierr.Error{Status: code, Type: "invalid_request_error", Code: "upstream_refused",
				Message: fmt.Sprintf("The engine refused the request (HTTP %d).", code)}
		}
		x.answer(ctx, e.LoggedAs("upstream_not_json"))
		return true
	}
	if code >= 200 && code <= 299 {
		x.learn(v, b)
	}
	x.replied(ctx, code)
	ctx.SetContentType("application/json")
	// The output stays charged until fasthttp has written it; SetBody would also copy it into a
	// pooled buffer that outlives the reply.
	ctx.Response.SetBodyStream(reply.ChargedBody(out, c), len(out))
	return true
}

// overBudget answers a reply that does not fit in upstream.max_buffered_bytes: 503 with
// Retry-After in the route's envelope. The caller aborts the engine's request.
func (x *exchange) overBudget(ctx *fasthttp.RequestCtx, b *backends.Backend) {
	x.g.metrics.repliesOverBudget.Inc()
	x.g.log.Warn("engine reply over the buffered-reply budget", zap.String("request_id", x.rid), zap.String("backend", b.Name),
		zap.Int64("max_buffered_bytes", x.g.replies.Max()))
	x.answer(ctx, apierr.ReplyOverBudget())
}

// cut records a leak: the incident, the quarantine of every backend on the path, and aborts
// of the request on the engines.
func (x *exchange) cut(h *canary.Hit, b *backends.Backend, rids []string, other *backends.Backend) {
	x.ended(0, apierr.UpstreamIntegrity().Code)
	x.watch.Leak(*h)
	abort(b, rids, other)
}

// abort tells a leg's engine, and its PD peer (nil: none), to drop the request: the one way a
// leg given up is aborted.
func abort(b *backends.Backend, rids []string, other *backends.Backend) {
	b.AbortAll(rids)
	if other != nil {
		other.AbortAll(rids)
	}
}

// learn raises the safety ratio from the prompt count a unified or decode engine reported for a
// prompt that was estimated (never from prefill, which reports 1 for a stubbed prompt).
func (x *exchange) learn(reply any, b *backends.Backend) {
	if x.estimate <= 0 || b.Role == config.RolePrefill || len(x.req.Prompts) != 1 {
		return
	}
	x.counter.Learn(x.estimate, backends.PromptCount(reply)) // the same reader as settlement
}

// replyHeaders are the engine reply headers a client may see. Everything else an engine sets
// (its own diagnostics, cookies, a simulator's ground truth) stays behind: headers are text a
// client reads, and only these carry nothing a tenant could learn another's data from.
func copyReplyHeaders(ctx *fasthttp.RequestCtx, l *backends.Leg) {
	if ra := l.Header(fasthttp.HeaderRetryAfter); len(ra) > 0 && len(ra) <= 6 && allDigits(ra) {
		ctx.Response.Header.SetBytesV(fasthttp.HeaderRetryAfter, ra)
	}
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
