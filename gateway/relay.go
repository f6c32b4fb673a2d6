package gateway

import (
	"errors"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
)

// newEventRelay is the reply stream for this exchange, reporting to sink.
func (x *exchange) newEventRelay(gd *reply.Guard, sink reply.Sink) *reply.Stream {
	return reply.NewStream(reply.StreamOptions{
		Guard: gd, MaxEventBytes: x.g.cfg.Upstream.MaxEventBytes, HideUsage: x.hideUsage, Sink: sink,
		FailEvent: streamFailEvent[x.kind],
		CutEvent:  streamCutEvent[x.kind],
	})
}

// Value notes an event's decoded value (kvgate limits: usage as decoded).
func (r *relayReader) Value(v any) { r.x.noteEvent(v) }

// Passed notes an event passed on undecoded (it carries no usage).
func (r *relayReader) Passed(carriesText bool) { r.x.notePassed(carriesText) }

// Leak records the incident and aborts the leg and its PD peer.
func (r *relayReader) Leak(h canary.Hit) { r.x.cut(&h, r.l.B, r.l.Rids, r.other) }

// Failed records and logs why the gateway ended the engine's stream.
func (r *relayReader) Failed(code string, err error) {
	r.x.ended(0, code)
	r.x.g.log.Warn("engine stream ended by the gateway", zap.String("request_id", r.x.rid), zap.String("upstream", r.x.upstream),
		zap.String("error_code", code), zap.Error(err))
}

var _ reply.Sink = (*relayReader)(nil)

// The events that end a stream the gateway failed or cut, per route kind: built once, since a
// stream rarely needs them.
var streamFailEvent, streamCutEvent, streamDrainEvent = func() (fail, cut, drain [request.Kinds][]byte) {
	for k := request.Kind(0); k < request.Kinds; k++ {
		fail[k] = errorEvent(k, apierr.UpstreamFailed("The engine's stream failed."))
		cut[k] = errorEvent(k, apierr.UpstreamIntegrity())
		drain[k] = errorEvent(k, apierr.ShuttingDown())
	}
	return fail, cut, drain
}()

// relayReader is the client's body for a streamed reply. fasthttp calls Read until EOF, writing
// and flushing each chunk (one write system call each), and calls Close when the body is done or
// the client is gone. It owns the upstream response from the moment it is set as the body stream.
type relayReader struct {
	x     *exchange
	l     *backends.Leg
	other *backends.Backend
	src   io.Reader
	ev    *reply.Stream
	// peek: src is the leg's body itself (no content coding between), so l.BodyReady tells
	// whether reading on would wait for the engine.
	peek bool

	readBuf [16 << 10]byte
	eof     bool // upstream finished (cleanly or not); ev.out holds the rest
	clean   bool // upstream reached its end normally
	once    sync.Once
}

func (x *exchange) newRelayReader(l *backends.Leg, other *backends.Backend, src io.Reader, peek bool, gd *reply.Guard) *relayReader {
	r := &relayReader{x: x, l: l, other: other, src: src, peek: peek}
	r.ev = x.newEventRelay(gd, r)
	return r
}

// Read hands fasthttp the next processed bytes. Each upstream read is parsed and scanned at once
// (one event is bounded), so a client that left is noticed at the next write, not after an endless
// event was buffered. What is ready goes out as soon as the engine has nothing more buffered
// (or p is full): events the engine sent back to back leave in one write, and a complete event is
// never held while the relay waits on the engine (issue 33).
func (r *relayReader) Read(p []byte) (n int, err error) {
	defer func() {
		// fasthttp reads the body on its connection goroutine, where nothing recovers: a
		// panic here ends this stream with an error event and leaves every other one alone.
		if v := recover(); v != nil {
			panics.Note(r.x.g.log, "stream", v)
			r.x.ended(500, apierr.Internal.Code)
			r.eof, r.clean = true, false
			tail := errorEvent(r.x.kind, apierr.Internal)
			n = copy(p, tail)
			r.ev.Abort(tail[n:])
			err = nil
		}
	}()
	for {
		if out := len(r.ev.Pending()); out > 0 && (out >= len(p) || r.eof || r.ev.Ended() || !r.upstreamReady()) {
			break
		}
		if r.eof || r.ev.Ended() {
			return 0, io.EOF
		}
		got, err := r.src.Read(r.readBuf[:])
		if got > 0 {
			t := time.Now() // kvgate overhead
			r.ev.Write(r.readBuf[:got])
			r.x.ohStreamRead(t) // kvgate overhead
		}
		if r.ev.Ended() || err == nil {
			continue
		}
		r.eof = true
		if !errors.Is(err, io.EOF) && r.x.noteDrainCut() {
			// What was already processed is still sent; the error event says why it ends.
			r.ev.Abort(append(append([]byte(nil), r.ev.Pending()...), streamDrainEvent[r.x.kind]...))
			continue
		}
		if !errors.Is(err, io.EOF) {
			// Headers are on the wire: end the stream with an error event, never a 502 page.
			r.ev.Fail("upstream_stream_error", err)
			continue
		}
		r.ev.End()
		r.clean = !r.ev.Ended()
	}
	n = copy(p, r.ev.Pending())
	r.ev.Consume(n)
	if n > 0 && r.x.firstByte.Load() == 0 {
		r.x.firstByte.Store(int64(max(time.Since(r.x.start), 1))) // for the access log: time to first byte
	}
	return n, nil
}

// upstreamReady says the next upstream read returns without waiting for the engine (its bytes
// are buffered already); false when that cannot be told.
func (r *relayReader) upstreamReady() bool { return r.peek && r.l.BodyReady() }

// Close releases the upstream reply. If the stream did not finish (client gone, cut, error), the
// engines are told to abort the request.
func (r *relayReader) Close() error {
	defer panics.Recover(r.x.g.log, "stream_close")
	r.once.Do(func() {
		if !r.clean {
			abort(r.l.B, r.l.Rids, r.other)
			if r.x.errMsg == "" {
				// The client left mid-stream: logged as nginx's 499 (the status line it
				// got said 200, but the reply it read is not complete).
				r.x.ended(apierr.ClientGone, "client_gone")
			}
		}
		r.x.closeLeg(r.l)
		r.ev.Release() // nothing more is read from it: its buffers go to the next reply
	})
	return nil
}
