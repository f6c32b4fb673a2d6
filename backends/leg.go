package backends

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/internal/panics"
)

// This file is the engine layer's request side: everything that speaks SGLang's protocol for a
// generation request. Building the engine body (our rids, PD bootstrap host/port/room), sending
// one leg and handing its reply out as status, headers and a body stream, the prefill leg of a
// PD pair, aborts. The gateway never sees the HTTP client.

// DefaultMaxNewTokens is SGLang's output length for /generate when sampling_params names none.
const DefaultMaxNewTokens = 128

// abortTimeout bounds one /abort_request call.
const abortTimeout = 2 * time.Second

// Rids are the engine request ids of one try: one per batch item (base-0, base-1, …) or base.
func Rids(base string, batch bool, items int) []string {
	if !batch {
		return []string{base}
	}
	out := make([]string, items)
	for i := range out {
		out[i] = base + "-" + strconv.Itoa(i)
	}
	return out
}

// EngineBody is the body an engine gets: the sanitized client fields plus our rids and, for a
// PD pair (prefill non-nil), the bootstrap fields with a new room per item (SGLang's PD
// protocol: the same body to both legs). fields is not modified.
func EngineBody(fields map[string]json.RawMessage, rids []string, batch bool, prefill *Backend) []byte {
	return EngineBodyWith(fields, nil, rids, batch, prefill)
}

// Field is one field an engine body gets in place of the client's (or in addition).
type Field struct {
	Key   string
	Value json.RawMessage
	// str, when Value is nil, is a string value written into the body as JSON (our rid:
	// no buffer of its own to escape).
	str string
}

// EngineBodyWith is EngineBody with extra fields set over the client's, written straight into
// the body: the client's fields are not copied into another map first (issue 23).
func EngineBodyWith(fields map[string]json.RawMessage, extra []Field, rids []string, batch bool, prefill *Backend) []byte {
	// own lives on the stack for the usual request (one rid, a few fields): encodeObject copies
	// every value into the body and keeps none of them.
	var ownBuf [8]Field
	own := append(ownBuf[:0], extra...)
	if batch {
		own = append(own, Field{Key: "rid", Value: mustJSON(rids)})
	} else {
		own = append(own, Field{Key: "rid", str: rids[0]})
	}
	if prefill != nil {
		port := prefill.Capacity().BootstrapPort
		if batch {
			hosts, ports, rooms := make([]string, len(rids)), make([]int, len(rids)), make([]uint64, len(rids))
			seen := map[uint64]bool{}
			for i := range rooms {
				hosts[i], ports[i] = prefill.Host, port
				for rooms[i] = newRoom(); seen[rooms[i]]; rooms[i] = newRoom() {
				}
				seen[rooms[i]] = true
			}
			own = append(own, Field{Key: "bootstrap_host", Value: mustJSON(hosts)}, Field{Key: "bootstrap_port", Value: mustJSON(ports)}, Field{Key: "bootstrap_room", Value: mustJSON(rooms)})
		} else {
			own = append(own, Field{Key: "bootstrap_host", Value: mustJSON(prefill.Host)}, Field{Key: "bootstrap_port", Value: mustJSON(port)}, Field{Key: "bootstrap_room", Value: mustJSON(newRoom())})
		}
	}
	return encodeObject(fields, own)
}

// appendJSONString appends s as a JSON string: directly when it needs no escaping (our rids are
// "kvg-" and hex digits), else as encoding/json writes it.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return append(dst, mustJSON(s)...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings, ints and raw JSON only
	}
	return b
}

// encodeObject writes fields as a JSON object, with own's fields in place of any of the same
// name (a later own field wins over an earlier one). The values are valid JSON already (from the
// decoder or json.Marshal): json.Marshal would re-scan every one of them.
func encodeObject(f map[string]json.RawMessage, own []Field) []byte {
	overridden := func(k string) bool {
		for _, o := range own {
			if o.Key == k {
				return true
			}
		}
		return false
	}
	n := 2
	for k, v := range f {
		n += len(k) + len(v) + 4
	}
	for _, o := range own {
		n += len(o.Key) + len(o.Value) + len(o.str) + 6
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for k, v := range f {
		if overridden(k) {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, k) // keys are allow-listed ASCII names
		b = append(b, ':')
		b = append(b, v...)
	}
	for i, o := range own {
		later := false
		for _, p := range own[i+1:] {
			later = later || p.Key == o.Key
		}
		if later {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, o.Key)
		b = append(b, ':')
		if o.Value == nil {
			b = appendJSONString(b, o.str)
			continue
		}
		b = append(b, o.Value...)
	}
	return append(b, '}')
}

func newRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) >> 1 // [0, 2^63−1]
}

// Leg is one upstream request whose reply headers have arrived. Whoever holds it calls Release
// once (the gateway's relay, when the client's body is done).
type Leg struct {
	B    *Backend
	Rids []string
	req  *fasthttp.Request
	resp *fasthttp.Response
	body legBody // the reply body Body hands out (bodyready.go)
}

// Send posts body to path on the engine and waits for the reply's headers (the body streams).
// A fresh request, so no client header (credentials, cookies, hop-by-hop) can reach the engine:
// only our request id, the W3C traceparent of the leg's span (when tracing is on), the backend's
// own key and a request for unencoded replies.
func (b *Backend) Send(path string, body []byte, rids []string, requestID, traceparent string, stream bool) (*Leg, error) {
	l := new(Leg)
	if err := b.SendInto(l, path, body, rids, requestID, traceparent, stream); err != nil {
		return nil, err
	}
	return l, nil
}

// SendInto is Send into a Leg the caller holds (the gateway's exchange has one: no allocation
// per request). On an error l holds nothing.
func (b *Backend) SendInto(l *Leg, path string, body []byte, rids []string, requestID, traceparent string, stream bool) error {
	req := fasthttp.AcquireRequest()
	var uri [256]byte // the URI is copied into req: no string made for it
	req.SetRequestURIBytes(append(append(uri[:0], b.base...), path...))
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("X-Request-Id", requestID)
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
	}
	req.Header.Set("Accept-Encoding", "identity")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
	}
	req.SetBodyRaw(body)
	*l = Leg{B: b, Rids: rids, req: req, resp: fasthttp.AcquireResponse()}
	if err := b.client.Do(req, l.resp); err != nil {
		l.Release()
		return err
	}
	return nil
}

// Status is the reply's HTTP status.
func (l *Leg) Status() int { return l.resp.StatusCode() }

// ContentType is the reply's Content-Type.
func (l *Leg) ContentType() []byte { return l.resp.Header.ContentType() }

// ContentLength is the reply's declared body length; negative when none was declared (chunked
// or read to the end).
func (l *Leg) ContentLength() int { return l.resp.Header.ContentLength() }

// Header is one reply header's value.
func (l *Leg) Header(name string) []byte { return l.resp.Header.Peek(name) }

// Headers are the reply's headers, name and value, in order.
func (l *Leg) Headers() iter.Seq2[[]byte, []byte] { return l.resp.Header.All() }

// VisitHeaders calls f for every reply header.
func (l *Leg) VisitHeaders(f func(k, v []byte)) { l.resp.Header.VisitAll(f) }

// Body is the reply body as a stream (fasthttp has none for 1xx, 204, 304 replies). Between its
// reads, BodyReady says whether the next one would wait for the engine.
func (l *Leg) Body() io.Reader {
	if s := l.resp.BodyStream(); s != nil {
		l.body = legBody{s: s, boundary: true, chunked: l.resp.Header.ContentLength() == -1}
		return &l.body
	}
	return bytes.NewReader(l.resp.Body())
}

// Release returns the leg's buffers and closes its body stream; later calls do nothing.
func (l *Leg) Release() {
	l.body = legBody{} // its read buffer goes back to fasthttp's pool with the response
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

// AbortAll asks b to drop every request of one try (in the background, bounded).
func (b *Backend) AbortAll(rids []string) {
	for _, r := range rids {
		b.Abort(r, abortTimeout)
	}
}

// PrefillLeg is the outcome of a PD pair's prefill request, owned by its goroutine until Done is
// closed and read-only after.
type PrefillLeg struct {
	Done        chan struct{}
	Status      int
	ContentType []byte
	Body        []byte // a bounded copy, for the error case
	Err         error
}

// OK says the prefill succeeded.
func (p *PrefillLeg) OK() bool { return p.Err == nil && p.Status >= 200 && p.Status <= 299 }

// maxPrefillError bounds the prefill reply kept (it is only passed on when it is an error).
const maxPrefillError = 1 << 20

// StartPrefill sends the prefill leg of a PD pair. Its reply is drained and discarded (its
// output is one token); observe is called once its headers came, with the status, or with the
// transport error (status 0), for metrics and the leg's span.
func (b *Backend) StartPrefill(path string, body []byte, rids []string, requestID, traceparent string, observe func(b *Backend, status int, err error)) *PrefillLeg {
	p := &PrefillLeg{Done: make(chan struct{})}
	go func() {
		defer close(p.Done)
		defer func() {
			if v := recover(); v != nil {
				panics.Note(b.log, "prefill", v)
				p.Err = fmt.Errorf("prefill leg panicked: %v", v)
			}
		}()
		l, err := b.Send(path, body, rids, requestID, traceparent, false)
		if err != nil {
			p.Err = err
			observe(b, 0, err)
			return
		}
		defer l.Release()
		observe(b, l.Status(), nil)
		p.Status, p.ContentType = l.Status(), append([]byte(nil), l.ContentType()...)
		var buf bytes.Buffer
		src := l.Body()
		if _, err := io.Copy(&buf, io.LimitReader(src, maxPrefillError)); err != nil {
			p.Err = fmt.Errorf("reading the prefill reply: %w", err)
			return
		}
		_, _ = io.Copy(io.Discard, src)
		p.Body = buf.Bytes()
	}()
	return p
}

// A decode leg whose prefill failed is aborted every abortRepeat, at most abortRepeats times.
const (
	abortRepeat       = 200 * time.Millisecond
	abortRepeats      = 50
	maxRepeatedAborts = 200 // calls per failed try, all batch items together
)

// AbortWhenPrefillFails cancels decode's request once the prefill failed while decode still
// waits for its KV (decode would otherwise wait out its transfer timeout). The abort may reach
// decode before decode registered the request (the prefill failed at once), so it is repeated
// until decodeAnswered closes, bounded in count.
func AbortWhenPrefillFails(decode *Backend, rids []string, pf *PrefillLeg, decodeAnswered <-chan struct{}) {
	go func() {
		defer panics.Recover(decode.log, "abort")
		select {
		case <-pf.Done:
		case <-decodeAnswered:
			return
		}
		if pf.OK() {
			return
		}
		t := time.NewTicker(abortRepeat)
		defer t.Stop()
		for i := 0; i < max(1, min(abortRepeats, maxRepeatedAborts/len(rids))); i++ {
			decode.AbortAll(rids)
			select {
			case <-decodeAnswered:
				return
			case <-t.C:
			}
		}
	}()
}
