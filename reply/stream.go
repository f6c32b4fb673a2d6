package reply

import (
	"errors"
	"fmt"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/internal/sse"
)

// Stream turns an engine's event stream into the client's: every event is parsed (every
// framing the event-stream format allows), its data decoded as one JSON value, scanned, and
// written anew. The client receives only events this serialised from what it scanned; comments,
// ids and retry fields are dropped, an event name is kept after its scan.
type Stream struct {
	o      StreamOptions
	parser *sse.Parser
	// out: events ready for the client. Pending hands it out; once it is all consumed the next
	// event reuses its storage from the start (no allocation per event).
	out    []byte
	sent   int        // out[:sent] was consumed
	events int        // events queued
	fast   *fastState // nil until the first event that may take the fast path
	noFast bool       // tests: every event takes the slow path
	// ended: the stream was ended early (a leak, or an event that was refused); nothing more of
	// the engine's bytes is read or sent.
	ended bool
}

// StreamOptions set up a Stream.
type StreamOptions struct {
	Guard         *Guard // nil when canaries are off
	MaxEventBytes int
	// HideUsage drops OpenAI's usage-only chunk (asked of the engine for settlement, not by the
	// client).
	HideUsage bool
	// Sink is told what the stream carried and how it ended (nil: nobody).
	Sink Sink
	// FailEvent and CutEvent end the client's stream, in its route's error shape: after a
	// failure of the engine's stream, and after a cut on a foreign marker.
	FailEvent, CutEvent []byte
}

// Sink is what a Stream reports to (the gateway's exchange). Value sees every event's decoded
// value (nil: produced, but refused), for usage; Passed sees, instead, every event passed on
// without being decoded (the fast path, inplace.go): such an event holds no usage section, and
// carriesText is backends.CarriesText of it. Leak is the foreign marker (or prompt text) the
// stream was cut on: record the incident, abort the engines. Failed says why the gateway ended
// the stream (the client gets FailEvent).
type Sink interface {
	Value(v any)
	Passed(carriesText bool)
	Leak(h canary.Hit)
	Failed(code string, err error)
}

// NewStream starts a stream.
func NewStream(o StreamOptions) *Stream {
	return &Stream{o: o, parser: sse.NewParser(o.MaxEventBytes)}
}

// Write takes stream bytes as they arrive.
func (e *Stream) Write(b []byte) {
	if e.ended {
		return
	}
	e.parser.Write(b)
	for !e.ended {
		ev, ok, err := e.parser.Next()
		if err != nil {
			e.Fail("upstream_event_too_large", fmt.Errorf("%w (upstream.max_event_bytes = %d)", err, e.o.MaxEventBytes))
			return
		}
		if !ok {
			return
		}
		e.emit(ev)
	}
}

// End is the upstream's clean end: a last event without its blank line is scanned like the
// others, held text is released, and a stream with no event at all is an error.
func (e *Stream) End() {
	if e.ended {
		return
	}
	if ev, ok := e.parser.End(); ok {
		e.emit(ev)
	}
	e.flushGuard()
	if !e.ended && e.events == 0 {
		e.Fail("upstream_empty_stream", errors.New("the stream carried no events"))
	}
}

// Fail ends the stream with an error event; the detail goes to the Sink only.
func (e *Stream) Fail(code string, err error) {
	e.ended = true
	if e.o.Sink != nil {
		e.o.Sink.Failed(code, err)
	}
	e.out = append(e.out, e.o.FailEvent...)
}

// Abort ends the stream at once with tail (an error event of the caller's), dropping what was
// queued.
func (e *Stream) Abort(tail []byte) {
	e.ended = true
	e.out, e.sent = tail, 0
}

// Ended says nothing more of the engine's stream will be sent.
func (e *Stream) Ended() bool { return e.ended }

// Pending is what is ready for the client; Consume drops the first n bytes of it. The bytes
// are the stream's: valid until the next Write, End or Fail (copy what must outlive them).
func (e *Stream) Pending() []byte { return e.out[e.sent:] }

// Consume drops n bytes of Pending, once they are written.
func (e *Stream) Consume(n int) {
	if e.sent += n; e.sent == len(e.out) {
		e.out, e.sent = e.out[:0], 0
	}
}

// Release gives the stream's scanning buffers back for other replies once nothing more of it is
// read (the client's body closed): Write does nothing after it. Pending stays valid.
func (e *Stream) Release() {
	e.ended = true
	if e.fast != nil {
		putFast(e.fast)
		e.fast = nil
	}
	if e.o.Guard != nil {
		e.o.Guard.releaseKit()
	}
}

// Leak is the foreign marker the stream was cut on, or nil.
func (e *Stream) Leak() *Hit {
	if e.o.Guard == nil {
		return nil
	}
	return e.o.Guard.leak
}

// cut ends the reply on a foreign marker: nothing more of the engine's text is sent, an error
// event (and [DONE]) close the body, and the incident is recorded.
func (e *Stream) cut() {
	e.ended = true
	if h := e.Leak(); h != nil && e.o.Sink != nil {
		e.o.Sink.Leak(*h)
	}
	e.out = append(e.out, e.o.CutEvent...)
}

// emit scans one event and queues what the client gets: "[DONE]" as it is, anything else as a
// JSON value re-serialised after the scan, under its event name (scanned too).
func (e *Stream) emit(ev sse.Event) {
	if string(ev.Data) == "[DONE]" {
		e.flushGuard() // held text goes out in events of its own before [DONE]
		if !e.ended {
			e.out = append(e.out, "data: [DONE]\n\n"...)
			e.events++
		}
		return
	}
	if e.emitFast(ev) {
		return
	}
	v, shadowed, err := DecodeStrict(ev.Data)
	if err != nil {
		e.onEvent(nil) // an event that was produced, but refused
		if e.o.Guard != nil && !e.o.Guard.detectIn(string(ev.Data), v, shadowed) {
			e.cut() // refused either way, but a marker in it is a leak to record
			return
		}
		e.Fail("upstream_bad_event", fmt.Errorf("event data is not one JSON value: %w", err))
		return
	}
	e.onEvent(v)
	if e.o.HideUsage && usageOnlyChunk(v) {
		return
	}
	name := ev.Name
	if blockEnd[name] || blockEnd[eventType(v)] {
		e.flushGuard() // text held in a block goes out before the event that closes it
		if e.ended {
			return
		}
	}
	if gd := e.o.Guard; gd != nil {
		var ok bool
		if name != "" {
			if name, ok = gd.scanString(name); !ok {
				e.cut()
				return
			}
		}
		if v, ok = gd.event(v); !ok {
			if gd.malformed && gd.leak == nil {
				e.Fail("upstream_bad_event", ErrMalformed)
				return
			}
			e.cut()
			return
		}
	}
	if name != "" {
		e.out = append(append(append(e.out, "event: "...), name...), '\n')
	}
	e.out = append(AppendJSON(append(e.out, "data: "...), v), "\n\n"...)
	e.events++
}

func (e *Stream) onEvent(v any) {
	if e.o.Sink != nil {
		e.o.Sink.Value(v)
	}
}

// flushGuard releases what the scanners held, as events, or cuts on a leak settled there.
func (e *Stream) flushGuard() {
	gd := e.o.Guard
	if gd == nil || e.ended {
		return
	}
	for _, h := range gd.flush() {
		if h.name != "" {
			e.out = append(append(append(e.out, "event: "...), h.name...), '\n')
		}
		e.out = append(append(append(e.out, "data: "...), h.data...), "\n\n"...)
	}
	if gd.leak != nil {
		e.cut()
	}
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
