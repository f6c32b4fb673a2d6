package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
)

// maxBufferedReply caps a non-streaming engine reply held for scanning and pass-through.
const maxBufferedReply = 64 << 20

// abortTimeout bounds one /abort_request call.
const abortTimeout = 2 * time.Second

// A decode leg whose prefill failed is aborted every abortRepeat, at most abortRepeats times.
const (
	abortRepeat       = 200 * time.Millisecond
	abortRepeats      = 50
	maxRepeatedAborts = 200 // calls per failed try, all batch items together
)

// leg is one upstream request of an exchange (one for unified, two for PD).
type leg struct {
	b *backends.Backend
	// rids are the engine request ids this leg carries (one per batch item).
	rids []string
	req  *fasthttp.Request
	resp *fasthttp.Response
	err  error
}

// abort asks b to drop every request of one try (in the background, bounded).
func abort(b *backends.Backend, rids []string) {
	for _, r := range rids {
		b.Abort(r, abortTimeout)
	}
}

// bodyReader is a response's body as a stream: fasthttp gives none for replies that cannot carry
// a body (1xx, 204, 304).
func bodyReader(resp *fasthttp.Response) io.Reader {
	if s := resp.BodyStream(); s != nil {
		return s
	}
	return bytes.NewReader(resp.Body())
}

func (l *leg) release() {
	if l.resp != nil {
		_ = l.resp.CloseBodyStream()
		fasthttp.ReleaseResponse(l.resp)
		l.resp = nil
	}
	if l.req != nil {
		fasthttp.ReleaseRequest(l.req)
		l.req = nil
	}
}

func newRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) >> 1 // [0, 2^63−1]
}

// buildLeg prepares the upstream request: a fresh request, so no client header (credentials,
// cookies, hop-by-hop) can reach the engine; only ours and the backend's own key.
func (x *exchange) buildLeg(b *backends.Backend, body []byte, rids []string) *leg {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + b.Addr + x.kind.path())
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("X-Request-Id", x.rid)
	if x.req.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
	}
	req.SetBodyRaw(body)
	return &leg{b: b, rids: rids, req: req}
}

// ridsFor are the engine request ids of one try: the engine rid is always ours (never the
// client's X-Request-Id, which would let a client collide with or abort another's request), with
// one id per batch item.
func (x *exchange) ridsFor(base string) []string {
	if !x.req.batch {
		return []string{base}
	}
	out := make([]string, len(x.req.prompts))
	for i := range out {
		out[i] = base + "-" + strconv.Itoa(i)
	}
	return out
}

// body serializes the sanitized request with our rids and, for PD, the bootstrap fields.
func (x *exchange) body(rids []string, prefill *backends.Backend) []byte {
	f := make(map[string]json.RawMessage, len(x.req.fields)+4)
	for k, v := range x.req.fields {
		f[k] = v
	}
	items := len(x.req.prompts)
	if x.req.batch {
		f["rid"] = mustJSON(rids)
	} else {
		f["rid"] = mustJSON(rids[0])
	}
	if prefill != nil {
		port := prefill.Capacity().BootstrapPort
		if x.req.batch {
			hosts, ports, rooms := make([]string, items), make([]int, items), make([]uint64, items)
			seen := map[uint64]bool{}
			for i := range rooms {
				hosts[i], ports[i] = prefill.Host, port
				for rooms[i] = newRoom(); seen[rooms[i]]; rooms[i] = newRoom() {
				}
				seen[rooms[i]] = true
			}
			f["bootstrap_host"], f["bootstrap_port"], f["bootstrap_room"] = mustJSON(hosts), mustJSON(ports), mustJSON(rooms)
		} else {
			f["bootstrap_host"], f["bootstrap_port"], f["bootstrap_room"] = mustJSON(prefill.Host), mustJSON(port), mustJSON(newRoom())
		}
	}
	return encodeObject(f)
}

// encodeObject writes fields as a JSON object. The values came from the decoder (or from
// json.Marshal), so they are valid JSON already: json.Marshal would re-scan every one of them.
func encodeObject(f map[string]json.RawMessage) []byte {
	n := 2
	for k, v := range f {
		n += len(k) + len(v) + 4
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	first := true
	for k, v := range f {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendQuote(b, k) // keys are allow-listed ASCII names
		b = append(b, ':')
		b = append(b, v...)
	}
	return append(b, '}')
}

func retryable(code int) bool { return code == 408 || code == 429 || code >= 500 }

// forward sends the admitted request along x.route and relays the reply.
func (g *Gateway) forward(ctx *fasthttp.RequestCtx, x *exchange) {
	r := x.route
	tokens := x.decision.Tokens
	for _, b := range []*backends.Backend{r.Unified, r.Prefill, r.Decode} {
		if b != nil {
			b.AddInflight(tokens)
		}
	}
	releaseInflight := func() {
		for _, b := range []*backends.Backend{r.Unified, r.Prefill, r.Decode} {
			if b != nil {
				b.AddInflight(-tokens)
			}
		}
	}
	if r.Unified != nil {
		x.upstream = r.Unified.Name
		rids := x.ridsFor(x.engineRID)
		l := x.buildLeg(r.Unified, x.body(rids, nil), rids)
		l.resp = fasthttp.AcquireResponse()
		x.ohSent() // kvgate overhead
		l.err = r.Unified.Client.Do(l.req, l.resp)
		x.ohHeaders() // kvgate overhead
		g.countUpstream(l)
		if l.err != nil {
			releaseInflight()
			l.release()
			x.fail(ctx, upstreamFailed("The engine could not be reached: "+l.err.Error()))
			return
		}
		x.relay(ctx, l, nil, releaseInflight)
		x.ohReplied() // kvgate overhead
		return
	}
	x.upstream = r.Prefill.Name + "+" + r.Decode.Name
	for attempt := 0; ; attempt++ {
		last := attempt >= g.cfg.Upstream.Retries
		base := x.engineRID
		if attempt > 0 {
			base += "-r" + strconv.Itoa(attempt)
		}
		rids := x.ridsFor(base)
		body := x.body(rids, r.Prefill) // a new room on every try
		dl := x.buildLeg(r.Decode, body, rids)
		pf := x.startPrefill(g, x.buildLeg(r.Prefill, body, rids))
		// A prefill that fails while decode still waits for its KV cancels decode: the
		// request has failed, and decode would otherwise wait out its transfer timeout.
		decodeAnswered := make(chan struct{})
		go func() {
			select {
			case <-pf.done:
			case <-decodeAnswered:
				return
			}
			if pf.ok() {
				return
			}
			// The abort may reach decode before decode has registered the request (the
			// prefill failed at once), so it is repeated until decode answers (bounded).
			t := time.NewTicker(abortRepeat)
			defer t.Stop()
			// A large batch would multiply the calls: keep the total bounded.
			for i := 0; i < max(1, min(abortRepeats, maxRepeatedAborts/len(rids))); i++ {
				abort(r.Decode, rids)
				select {
				case <-decodeAnswered:
					return
				case <-t.C:
				}
			}
		}()
		dl.resp = fasthttp.AcquireResponse()
		x.ohSent() // kvgate overhead
		dl.err = r.Decode.Client.Do(dl.req, dl.resp)
		x.ohHeaders() // kvgate overhead
		close(decodeAnswered)
		g.countUpstream(dl)
		if dl.err != nil {
			// A transport error on one leg cancels the other.
			abort(r.Prefill, rids)
			dl.release()
			if !last {
				continue
			}
			releaseInflight()
			x.fail(ctx, upstreamFailed("The decode engine could not be reached: "+dl.err.Error()))
			return
		}
		if code := dl.resp.StatusCode(); code < 200 || code > 299 {
			abort(r.Prefill, rids)
			if retryable(code) && !last {
				dl.release()
				continue
			}
			// Decode's error first: pass it through.
			x.relay(ctx, dl, nil, releaseInflight)
			return
		}
		// Decode accepted. The request only succeeded if prefill did too.
		select {
		case <-pf.done:
		case <-time.After(g.cfg.Upstream.ResponseHeaderTimeout):
			abort(r.Prefill, rids)
			abort(r.Decode, rids)
			dl.release()
			if !last {
				continue
			}
			releaseInflight()
			x.fail(ctx, upstreamFailed("The prefill engine did not answer within upstream.response_header_timeout."))
			return
		}
		if !pf.ok() {
			abort(r.Decode, rids)
			dl.release()
			if (pf.err != nil || retryable(pf.status)) && !last {
				continue
			}
			releaseInflight()
			if pf.err != nil {
				x.fail(ctx, upstreamFailed("The prefill engine failed: "+pf.err.Error()))
				return
			}
			// The engine's own error, with its status (scanned like any reply).
			x.errMsg = "prefill_failed"
			if !x.writeEngineReply(ctx, pf.status, []byte(pf.contentType), pf.body, r.Prefill) {
				x.cut(x.lastLeak, r.Prefill, rids, r.Decode)
			}
			x.finish()
			return
		}
		x.relay(ctx, dl, r.Prefill, releaseInflight)
		x.ohReplied() // kvgate overhead
		return
	}
}

// prefillLeg is the outcome of a prefill request, owned by its goroutine until done is closed
// and read-only after.
type prefillLeg struct {
	done        chan struct{}
	status      int
	contentType string
	body        []byte // bounded copy, for the error case
	err         error
}

func (p *prefillLeg) ok() bool { return p.err == nil && p.status >= 200 && p.status <= 299 }

// startPrefill sends the prefill leg. Its reply is drained and discarded (its output is one
// token); the leg's buffers are released by the goroutine itself, so nothing else touches them.
func (x *exchange) startPrefill(g *Gateway, l *leg) *prefillLeg {
	p := &prefillLeg{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer l.release()
		l.resp = fasthttp.AcquireResponse()
		if l.err = l.b.Client.Do(l.req, l.resp); l.err != nil {
			p.err = l.err
			g.countUpstream(l)
			return
		}
		g.countUpstream(l)
		p.status, p.contentType = l.resp.StatusCode(), string(l.resp.Header.ContentType())
		var buf bytes.Buffer
		src := bodyReader(l.resp)
		if _, err := io.Copy(&buf, io.LimitReader(src, 1<<20)); err != nil {
			p.err = fmt.Errorf("reading the prefill reply: %w", err)
			return
		}
		_, _ = io.Copy(io.Discard, src)
		p.body = buf.Bytes()
	}()
	return p
}

func (g *Gateway) countUpstream(l *leg) {
	code := "0"
	if l.err == nil && l.resp != nil {
		code = strconv.Itoa(l.resp.StatusCode())
	}
	g.metrics.upstream.WithLabelValues(l.b.Name, code).Inc()
}

// relay writes the engine's reply to the client, normalised and scanned (reply.go): a 2xx reply
// to a streaming request is read as an event stream whatever its content type, event by event;
// anything else is read whole (bounded) as one JSON value. other is the PD peer leg's backend,
// aborted too if the reply is cut or the client goes away mid-stream.
func (x *exchange) relay(ctx *fasthttp.RequestCtx, l *leg, other *backends.Backend, done func()) {
	resp := l.resp
	code := resp.StatusCode()
	if h := x.scanHeaders(resp); h != nil {
		// A marker in a header is a leak like one in the body, though no header is passed on.
		defer func() {
			l.release()
			done()
			x.finish()
		}()
		x.lastLeak = h
		x.integrityError(ctx)
		x.cut(h, l.b, l.rids, other)
		return
	}
	copyReplyHeaders(ctx, resp)
	ctx.Response.Header.Set("X-Request-Id", x.rid)
	if code >= 200 && code <= 299 && code != 204 && x.req.stream {
		src, err := decodedBody(resp)
		if cs := charsetOf(resp.Header.ContentType()); err == nil && cs != "" && cs != "utf-8" && cs != "utf8" {
			err = fmt.Errorf("%w %q on an event stream (the format is UTF-8 only)", errCharset, cs)
		}
		if err != nil {
			x.refuseReply(ctx, l, other, done, err)
			return
		}
		ctx.SetStatusCode(code)
		ctx.Response.ImmediateHeaderFlush = true
		ctx.Response.Header.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		x.status = code
		ctx.SetBodyStream(x.newRelayReader(l, other, done, src), -1)
		return
	}
	defer func() {
		l.release()
		done()
		x.finish()
	}()
	if code < 200 || code == 204 || code == 304 {
		// An engine never answers a generation request like this: something else is there.
		abort(l.b, l.rids)
		x.upstreamError(ctx, "upstream_error", fmt.Errorf("engine %s answered %d with no reply body", l.b.Name, code))
		return
	}
	src, err := decodedBody(resp)
	if err != nil {
		abort(l.b, l.rids)
		x.upstreamError(ctx, "upstream_error", fmt.Errorf("engine %s: %w", l.b.Name, err))
		return
	}
	body, err := io.ReadAll(io.LimitReader(src, maxBufferedReply+1))
	if err != nil || len(body) > maxBufferedReply {
		abort(l.b, l.rids)
		if err == nil {
			err = fmt.Errorf("reply larger than %d bytes", maxBufferedReply)
		}
		x.upstreamError(ctx, "upstream_error", fmt.Errorf("engine %s: reading the reply: %w", l.b.Name, err))
		return
	}
	if code >= 200 && code <= 299 {
		x.noteUsage(body) // kvgate limits
	}
	if !x.writeEngineReply(ctx, code, resp.Header.ContentType(), body, l.b) {
		x.cut(x.lastLeak, l.b, l.rids, other)
	}
}

// scanHeaders looks for foreign markers in every header of an engine's reply (names and
// values): headers are text an engine sends, whether or not they are passed on.
func (x *exchange) scanHeaders(resp *fasthttp.Response) *canary.Hit {
	gd := x.newGuard()
	if gd == nil {
		return nil
	}
	resp.Header.VisitAll(func(k, v []byte) {
		if gd.leak == nil {
			gd.scanString(string(k) + ": " + string(v))
		}
	})
	return gd.leak
}

// refuseReply answers a reply the gateway cannot read (an encoding or charset it does not
// decode) with a 502 instead of passing bytes the scanner could not see.
func (x *exchange) refuseReply(ctx *fasthttp.RequestCtx, l *leg, other *backends.Backend, done func(), err error) {
	defer func() {
		l.release()
		done()
		x.finish()
	}()
	abort(l.b, l.rids)
	if other != nil {
		abort(other, l.rids)
	}
	x.upstreamError(ctx, "upstream_unreadable", fmt.Errorf("engine %s: %w", l.b.Name, err))
}

// upstreamError answers 502 with a generic message; the detail (backend names, addresses,
// transport errors) goes only to the log.
func (x *exchange) upstreamError(ctx *fasthttp.RequestCtx, code string, detail error) {
	x.g.log.Warn("engine reply refused", zap.String("request_id", x.rid), zap.String("error_code", code), zap.Error(detail))
	writeError(ctx, upstreamFailed("The engine's reply could not be used."))
	ctx.Response.Header.Set("X-Request-Id", x.rid)
	x.status, x.errMsg = 502, code
}

// writeEngineReply passes an engine's whole reply on with its status, normalised and scanned
// (normaliseBody). It returns false when the scan found a foreign marker: the client then gets a
// 502 instead. A reply that is not JSON is never passed on (a client could decode it some other
// way): the client gets an error of our own.
func (x *exchange) writeEngineReply(ctx *fasthttp.RequestCtx, code int, contentType []byte, body []byte, b *backends.Backend) bool {
	out, v, err := x.normaliseBody(contentType, body)
	switch {
	case errors.Is(err, errLeak):
		x.integrityError(ctx)
		return false
	case err != nil:
		x.g.log.Warn("engine reply is not JSON", zap.String("request_id", x.rid), zap.String("backend", b.Name),
			zap.Int("status", code), zap.Error(err))
		e := upstreamFailed("The engine's reply could not be used.")
		if code >= 400 && code <= 499 {
			e = &apiError{Status: code, Type: "invalid_request_error", Code: "upstream_refused",
				Message: fmt.Sprintf("The engine refused the request (HTTP %d).", code)}
		}
		writeError(ctx, e)
		ctx.Response.Header.Set("X-Request-Id", x.rid)
		x.status, x.errMsg = e.Status, "upstream_not_json"
		return true
	}
	if code >= 200 && code <= 299 {
		x.learn(v, b)
	}
	x.status = code
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
	return true
}

// errLeak: the reply carried a foreign marker (x.lastLeak says which).
var errLeak = errors.New("foreign canary marker in the reply")

// normaliseBody is a whole reply as the client will get it: transcoded to UTF-8, decoded as one
// JSON value, scanned (engine errors too: they may quote the prompt they refused), and
// re-serialised from the scanned value. A body that is not JSON is still scanned as text, so a
// marker in it is recorded, but it is never passed on.
func (x *exchange) normaliseBody(contentType, body []byte) ([]byte, any, error) {
	gd := x.newGuard()
	text, err := toUTF8(body, charsetOf(contentType))
	var v any
	var shadowed []any
	if err == nil {
		v, shadowed, err = decodeStrict(text)
	}
	if err != nil {
		if gd != nil && !gd.detectIn(string(text), v, shadowed) {
			x.lastLeak = gd.leak
			return nil, nil, errLeak
		}
		return nil, nil, err
	}
	if gd != nil {
		var ok bool
		if v, ok = gd.body(v); !ok {
			x.lastLeak = gd.leak
			return nil, nil, errLeak
		}
	}
	return canonicalJSON(v), v, nil
}

func (x *exchange) integrityError(ctx *fasthttp.RequestCtx) {
	writeError(ctx, upstreamIntegrity())
	ctx.Response.Header.Set("X-Request-Id", x.rid)
	x.status = 502
}

// cut records a leak: the incident, the quarantine of every backend on the path, and aborts
// of the request on the engines.
func (x *exchange) cut(h *canary.Hit, b *backends.Backend, rids []string, other *backends.Backend) {
	x.errMsg = "upstream_integrity"
	x.g.recordIncident(x, canary.KindLeak, *h)
	abort(b, rids)
	if other != nil {
		abort(other, rids)
	}
}

// learn raises the safety ratio from the prompt count a unified or decode engine reported for a
// prompt that was estimated (never from prefill, which reports 1 for a stubbed prompt).
func (x *exchange) learn(reply any, b *backends.Backend) {
	if x.estimate <= 0 || b.Role == "prefill" || len(x.req.prompts) != 1 {
		return
	}
	x.g.ratio.Observe(x.estimate, max(promptTokens(reply, "usage"), promptTokens(reply, "meta_info")))
}

// promptTokens reads reply[section].prompt_tokens from a decoded reply (0 when absent).
func promptTokens(reply any, section string) int {
	m, _ := reply.(map[string]any)
	s, _ := m[section].(map[string]any)
	n, _ := s["prompt_tokens"].(json.Number)
	v, err := strconv.Atoi(n.String())
	if err != nil {
		return 0
	}
	return v
}

// sseError is an error event in OpenAI's envelope followed by [DONE].
func sseError(e *apiError) []byte {
	var b bytes.Buffer
	b.WriteString("data: ")
	b.Write(e.body())
	b.WriteString("\n\ndata: [DONE]\n\n")
	return b.Bytes()
}
