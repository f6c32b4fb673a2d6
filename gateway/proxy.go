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
	"sync"
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
	req.Header.Set("X-Request-Id", x.engineRID)
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
		l.err = r.Unified.Client.Do(l.req, l.resp)
		g.countUpstream(l)
		if l.err != nil {
			releaseInflight()
			l.release()
			x.fail(ctx, upstreamFailed("The engine could not be reached: "+l.err.Error()))
			return
		}
		x.relay(ctx, l, nil, releaseInflight)
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
		dl.err = r.Decode.Client.Do(dl.req, dl.resp)
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
			if !x.writeEngineReply(ctx, pf.status, pf.contentType, pf.body, r.Prefill) {
				x.cut(x.lastLeak, r.Prefill, rids, r.Decode)
			}
			x.finish()
			return
		}
		x.relay(ctx, dl, r.Prefill, releaseInflight)
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

// hop-by-hop and framing headers are never copied from an engine's reply.
var skipReplyHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
	"Server": true, "Date": true, "Set-Cookie": true,
}

func copyReplyHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response) {
	resp.Header.VisitAll(func(k, v []byte) {
		if !skipReplyHeaders[string(k)] {
			ctx.Response.Header.SetBytesKV(k, v)
		}
	})
}

// relay writes the engine's reply to the client. Errors and non-streaming bodies are read whole
// (bounded) and passed through; event streams are relayed event by event as they arrive.
// other is the PD peer leg's backend, aborted too if the client goes away mid-stream.
func (x *exchange) relay(ctx *fasthttp.RequestCtx, l *leg, other *backends.Backend, done func()) {
	resp := l.resp
	code := resp.StatusCode()
	copyReplyHeaders(ctx, resp)
	ctx.Response.Header.Set("X-Request-Id", x.rid)
	ctx.SetStatusCode(code)
	isStream := bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream"))
	if code >= 200 && code <= 299 && isStream {
		ctx.Response.ImmediateHeaderFlush = true
		ctx.Response.Header.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		rr := &relayReader{x: x, l: l, other: other, done: done, src: bodyReader(resp), guard: x.newGuard()}
		x.status = code
		ctx.SetBodyStream(rr, -1)
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
		writeError(ctx, upstreamFailed(fmt.Sprintf("The engine answered %d with no reply body.", code)))
		ctx.Response.Header.Set("X-Request-Id", x.rid)
		x.status, x.errMsg = 502, "upstream_error"
		return
	}
	body, err := io.ReadAll(io.LimitReader(bodyReader(resp), maxBufferedReply+1))
	if err != nil || len(body) > maxBufferedReply {
		abort(l.b, l.rids)
		msg := "The engine's reply was cut off"
		if err != nil {
			msg += ": " + err.Error()
		} else {
			msg += ": larger than the gateway buffers"
		}
		writeError(ctx, upstreamFailed(msg))
		ctx.Response.Header.Set("X-Request-Id", x.rid)
		x.status, x.errMsg = 502, "upstream_error"
		return
	}
	if code >= 200 && code <= 299 {
		x.learn(body, l.b)
	}
	if !x.writeEngineReply(ctx, code, "", body, l.b) {
		x.cut(x.lastLeak, l.b, l.rids, other)
	}
}

// writeEngineReply passes an engine's reply through with its status (and content type, when
// given), after the canary scan. It returns false when the scan found a foreign marker: the
// client then gets a 502 instead. An empty error body becomes a 502 JSON of our own.
func (x *exchange) writeEngineReply(ctx *fasthttp.RequestCtx, code int, contentType string, body []byte, b *backends.Backend) bool {
	if len(bytes.TrimSpace(body)) == 0 && (code < 200 || code > 299) {
		writeError(ctx, upstreamFailed(fmt.Sprintf("Engine %s answered %d with an empty body.", b.Name, code)))
		ctx.Response.Header.Set("X-Request-Id", x.rid)
		x.status = 502
		return true
	}
	if gd := x.newGuard(); gd != nil {
		// Engine errors are scanned too: they may quote the prompt they refused.
		clean, ok := gd.body(body)
		if !ok {
			x.lastLeak = gd.leak
			writeError(ctx, upstreamIntegrity())
			ctx.Response.Header.Set("X-Request-Id", x.rid)
			x.status = 502
			return false
		}
		body = clean
	}
	x.status = code
	ctx.SetStatusCode(code)
	if contentType != "" {
		ctx.SetContentType(contentType)
	}
	ctx.SetBody(body)
	return true
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
func (x *exchange) learn(body []byte, b *backends.Backend) {
	if x.estimate <= 0 || b.Role == "prefill" || len(x.req.prompts) != 1 {
		return
	}
	var reply struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		Meta struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"meta_info"`
	}
	if json.Unmarshal(body, &reply) != nil {
		return
	}
	x.g.ratio.Observe(x.estimate, max(reply.Usage.PromptTokens, reply.Meta.PromptTokens))
}

// relayReader is the client's body for a streamed reply. fasthttp calls Read until EOF, writing
// and flushing each chunk, and calls Close when the body is done or the client is gone. It owns
// the upstream response from the moment it is set as the body stream.
type relayReader struct {
	x     *exchange
	l     *leg
	other *backends.Backend
	done  func()
	src   io.Reader

	buf     []byte // upstream bytes not yet split into events
	out     []byte // processed bytes not yet handed to fasthttp
	readBuf [16 << 10]byte
	eof     bool // upstream finished (cleanly or not); out holds the rest
	clean   bool // upstream reached its end normally
	once    sync.Once
	guard   *guard // nil when canaries are off
	cut     bool   // a foreign marker ended the reply
}

func (r *relayReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof || r.cut {
			return 0, io.EOF
		}
		n, err := r.src.Read(r.readBuf[:])
		if n > 0 {
			r.buf = append(r.buf, r.readBuf[:n]...)
			r.takeEvents()
		}
		if r.cut || err == nil {
			continue // a cut has queued its error event
		}
		r.eof = true
		if !errors.Is(err, io.EOF) {
			// Headers are on the wire: end the stream with an error event, never a 502 page.
			r.x.errMsg = "upstream_stream_error"
			r.x.g.log.Warn("engine stream failed", zap.String("request_id", r.x.rid), zap.String("backend", r.l.b.Name), zap.Error(err))
			r.out = append(r.out, sseError(upstreamFailed("The engine's stream failed: "+err.Error()))...)
			continue
		}
		if len(bytes.TrimSpace(r.buf)) > 0 {
			r.buf = append(r.buf, "\n\n"...) // a last event without its blank line
			r.takeEvents()
		}
		if r.guard != nil && !r.cut {
			// A stream that ended without [DONE] still releases what the scanners held.
			r.out = append(r.out, r.guard.flush()...)
			if r.guard.leak != nil {
				r.cutNow()
			}
		}
		r.clean = !r.cut
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// cutNow ends the reply on a foreign marker: nothing more of the engine's text is sent, an
// error event and [DONE] close the body, and the incident is recorded.
func (r *relayReader) cutNow() {
	r.cut = true
	r.x.cut(r.guard.leak, r.l.b, r.l.rids, r.other)
	r.out = append(r.out, sseError(upstreamIntegrity())...)
}

// takeEvents moves every complete SSE event from buf to out, event by event, through the
// canary guard. A foreign marker cuts the stream: nothing of that event is sent, an error event
// and [DONE] end the body, and the upstream is not read further.
func (r *relayReader) takeEvents() {
	for !r.cut {
		end := eventEnd(r.buf)
		if end < 0 {
			return
		}
		ev := r.buf[:end]
		r.buf = r.buf[end:]
		if r.guard == nil {
			r.out = append(r.out, ev...)
			continue
		}
		out, ok := r.guard.event(ev)
		if !ok {
			r.cutNow()
			return
		}
		r.out = append(r.out, out...)
	}
}

// eventEnd is the length of the first complete SSE event in b (through its blank line, "\n\n"
// or "\r\n\r\n"), or -1.
func eventEnd(b []byte) int {
	lf := bytes.Index(b, []byte("\n\n"))
	crlf := bytes.Index(b, []byte("\r\n\r\n"))
	switch {
	case crlf >= 0 && (lf < 0 || crlf < lf):
		return crlf + 4
	case lf >= 0:
		return lf + 2
	}
	return -1
}

// Close releases the upstream reply. If the stream did not finish (client gone, cut, error), the
// engines are told to abort the request.
func (r *relayReader) Close() error {
	r.once.Do(func() {
		if !r.clean {
			abort(r.l.b, r.l.rids)
			if r.other != nil {
				abort(r.other, r.l.rids)
			}
			if r.x.errMsg == "" {
				r.x.errMsg = "client_gone"
			}
		}
		r.l.release()
		r.done()
		r.x.finish()
	})
	return nil
}

// sseError is an error event in OpenAI's envelope followed by [DONE].
func sseError(e *apiError) []byte {
	var b bytes.Buffer
	b.WriteString("data: ")
	b.Write(e.body())
	b.WriteString("\n\ndata: [DONE]\n\n")
	return b.Bytes()
}
