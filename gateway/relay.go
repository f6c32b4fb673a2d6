package gateway

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/internal/sse"
)

// eventRelay turns an engine's event stream into the client's: every event is parsed (every
// framing the event-stream format allows), its data decoded as one JSON value, scanned, and
// written anew. The client receives only events the gateway serialised from what it scanned;
// comments, ids and retry fields are dropped, an event name is kept after its scan. It knows
// nothing of fasthttp, so tests drive it with any bytes.
type eventRelay struct {
	x      *exchange
	parser *sse.Parser
	guard  *guard // nil when canaries are off
	out    []byte // events ready for the client
	events int    // events queued
	// ended: the stream was ended early (a leak, or an event the gateway refused); nothing more
	// of the engine's bytes is read or sent.
	ended bool
	// onLeak records the incident and aborts the engines (set by the relay's owner).
	onLeak func()
}

func (x *exchange) newEventRelay(onLeak func()) *eventRelay {
	return &eventRelay{x: x, parser: sse.NewParser(x.g.cfg.Upstream.MaxEventBytes), guard: x.newGuard(), onLeak: onLeak}
}

// write takes stream bytes as they arrive.
func (e *eventRelay) write(b []byte) {
	if e.ended {
		return
	}
	e.parser.Write(b)
	for !e.ended {
		ev, ok, err := e.parser.Next()
		if err != nil {
			e.fail("upstream_event_too_large", fmt.Errorf("%w (upstream.max_event_bytes = %d)", err, e.x.g.cfg.Upstream.MaxEventBytes))
			return
		}
		if !ok {
			return
		}
		e.emit(ev)
	}
}

// end is the upstream's clean end: a last event without its blank line is scanned like the
// others, held text is released, and a stream with no event at all is an error.
func (e *eventRelay) end() {
	if e.ended {
		return
	}
	if ev, ok := e.parser.End(); ok {
		e.emit(ev)
	}
	e.flushGuard()
	if !e.ended && e.events == 0 {
		e.fail("upstream_empty_stream", errors.New("the stream carried no events"))
	}
}

// fail ends the stream with an error event; the detail goes to the log only.
func (e *eventRelay) fail(code string, err error) {
	e.ended = true
	e.x.errMsg = code
	e.x.g.log.Warn("engine stream ended by the gateway", zap.String("request_id", e.x.rid), zap.String("upstream", e.x.upstream),
		zap.String("error_code", code), zap.Error(err))
	e.out = append(e.out, errorEvent(e.x.kind, apierr.UpstreamFailed("The engine's stream failed."))...)
}

// cut ends the reply on a foreign marker: nothing more of the engine's text is sent, an error
// event and [DONE] close the body, and the incident is recorded.
func (e *eventRelay) cut() {
	e.ended = true
	if e.onLeak != nil {
		e.onLeak()
	}
	e.out = append(e.out, errorEvent(e.x.kind, apierr.UpstreamIntegrity())...)
}

// emit scans one event and queues what the client gets: "[DONE]" as it is, anything else as a
// JSON value re-serialised after the scan, under its event name (scanned too).
func (e *eventRelay) emit(ev sse.Event) {
	if string(ev.Data) == "[DONE]" {
		e.flushGuard() // held text goes out in events of its own before [DONE]
		if !e.ended {
			e.out = append(e.out, "data: [DONE]\n\n"...)
			e.events++
		}
		return
	}
	v, shadowed, err := decodeStrict(ev.Data)
	if err != nil {
		e.x.noteEvent(nil) // kvgate limits: an event that was produced, but refused
		if e.guard != nil && !e.guard.detectIn(string(ev.Data), v, shadowed) {
			e.cut() // refused either way, but a marker in it is a leak to record
			return
		}
		e.fail("upstream_bad_event", fmt.Errorf("event data is not one JSON value: %w", err))
		return
	}
	e.x.noteEvent(v) // kvgate limits: usage as decoded
	if e.x.hideUsage && usageOnlyChunk(v) {
		return // kvgate limits: asked for settlement, not by the client
	}
	name := ev.Name
	if blockEnd[name] || blockEnd[eventType(v)] {
		e.flushGuard() // text held in a block goes out before the event that closes it
		if e.ended {
			return
		}
	}
	if e.guard != nil {
		var ok bool
		if name != "" {
			if name, ok = e.guard.scanString(name); !ok {
				e.cut()
				return
			}
		}
		if v, ok = e.guard.event(v); !ok {
			e.cut()
			return
		}
	}
	if name != "" {
		e.out = append(append(append(e.out, "event: "...), name...), '\n')
	}
	e.out = append(append(append(e.out, "data: "...), canonicalJSON(v)...), "\n\n"...)
	e.events++
}

// flushGuard releases what the scanners held, as events, or cuts on a leak settled there.
func (e *eventRelay) flushGuard() {
	if e.guard == nil || e.ended {
		return
	}
	for _, h := range e.guard.flush() {
		if h.name != "" {
			e.out = append(append(append(e.out, "event: "...), h.name...), '\n')
		}
		e.out = append(append(append(e.out, "data: "...), h.data...), "\n\n"...)
	}
	if e.guard.leak != nil {
		e.cut()
	}
}

// relayReader is the client's body for a streamed reply. fasthttp calls Read until EOF, writing
// and flushing each chunk, and calls Close when the body is done or the client is gone. It owns
// the upstream response from the moment it is set as the body stream.
type relayReader struct {
	x     *exchange
	l     *backends.Leg
	other *backends.Backend
	src   io.Reader
	ev    *eventRelay

	readBuf [16 << 10]byte
	eof     bool // upstream finished (cleanly or not); ev.out holds the rest
	clean   bool // upstream reached its end normally
	once    sync.Once
}

func (x *exchange) newRelayReader(l *backends.Leg, other *backends.Backend, src io.Reader) *relayReader {
	r := &relayReader{x: x, l: l, other: other, src: src}
	r.ev = x.newEventRelay(func() { x.cut(r.ev.guard.leak, l.B, l.Rids, other) })
	return r
}

// Read hands fasthttp the next processed bytes. Each upstream read is parsed at once and one
// event is bounded, so a client that left is noticed at the next write, not after an endless
// event was buffered.
func (r *relayReader) Read(p []byte) (n int, err error) {
	defer func() {
		// fasthttp reads the body on its connection goroutine, where nothing recovers: a
		// panic here ends this stream with an error event and leaves every other one alone.
		if v := recover(); v != nil {
			panics.Note(r.x.g.log, "stream", v)
			r.x.status, r.x.errMsg = 500, apierr.Internal.Code
			r.eof, r.clean = true, false
			r.ev.ended = true
			tail := errorEvent(r.x.kind, apierr.Internal)
			n = copy(p, tail)
			r.ev.out = tail[n:]
			err = nil
		}
	}()
	for len(r.ev.out) == 0 {
		if r.eof || r.ev.ended {
			return 0, io.EOF
		}
		got, err := r.src.Read(r.readBuf[:])
		if got > 0 {
			t := time.Now() // kvgate overhead
			r.ev.write(r.readBuf[:got])
			r.x.ohStreamRead(t) // kvgate overhead
		}
		if r.ev.ended || err == nil {
			continue
		}
		r.eof = true
		if !errors.Is(err, io.EOF) {
			// Headers are on the wire: end the stream with an error event, never a 502 page.
			r.ev.fail("upstream_stream_error", err)
			continue
		}
		r.ev.end()
		r.clean = !r.ev.ended
	}
	n = copy(p, r.ev.out)
	r.ev.out = r.ev.out[n:]
	return n, nil
}

// Close releases the upstream reply. If the stream did not finish (client gone, cut, error), the
// engines are told to abort the request.
func (r *relayReader) Close() error {
	defer panics.Recover(r.x.g.log, "stream_close")
	r.once.Do(func() {
		if !r.clean {
			r.l.B.AbortAll(r.l.Rids)
			if r.other != nil {
				r.other.AbortAll(r.l.Rids)
			}
			if r.x.errMsg == "" {
				// The client left mid-stream: logged as nginx's 499 (the status line it
				// got said 200, but the reply it read is not complete).
				r.x.errMsg, r.x.status = "client_gone", apierr.ClientGone
			}
		}
		r.x.closeLeg(r.l)
	})
	return nil
}

// blockEnd are the events (by SSE name or "type") after which no more text of the block comes:
// Anthropic's content_block_stop, message_delta and message_stop; the Responses API's done and
// completed events.
var blockEnd = map[string]bool{
	"content_block_stop": true, "message_delta": true, "message_stop": true,
	"response.output_text.done": true, "response.content_part.done": true, "response.output_item.done": true,
	"response.completed": true, "response.incomplete": true, "response.failed": true,
}

func eventType(v any) string {
	m, _ := v.(map[string]any)
	t, _ := m["type"].(string)
	return t
}

// usageOnlyChunk is the chunk include_usage adds to an OpenAI stream: usage and no choices.
func usageOnlyChunk(v any) bool {
	m, _ := v.(map[string]any)
	cs, isList := m["choices"].([]any)
	return isList && len(cs) == 0 && m["usage"] != nil
}
