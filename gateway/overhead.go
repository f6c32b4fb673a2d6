package gateway

// kvgate_overhead_seconds: the time a request spends in kvgate itself, not in the engine, so
// operators can see in production what the gateway costs. Three phases, each a few clock reads
// on the request path (hooks marked "kvgate overhead" in proxy.go and relay.go):
//
//   - before_upstream: from the request's arrival to the moment it is handed to the engine's
//     client (auth, body, parse, inject, count, decide, route, build), once per request;
//   - after_headers: from the engine's reply headers to the reply handed to the client (a whole
//     reply read, normalised, scanned and written; for a stream, its relay set up);
//   - stream_read: processing one upstream read of a stream (parse, decode, scan, re-serialise
//     the events in it).
//
// Time waiting for the engine (its headers, its next stream bytes) is in none of them.

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	phaseBeforeUpstream = "before_upstream"
	phaseAfterHeaders   = "after_headers"
	phaseStreamRead     = "stream_read"
)

func newOverheadHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_overhead_seconds",
		Help: "Time spent in kvgate, not in the engine, by phase: before_upstream (arrival to the engine call), after_headers (engine headers to reply handed on), stream_read (one upstream read of a stream relayed).",
		// 1 µs to ~150 ms: an ordinary request sits in the tens of µs, a 1M-token prompt in ms.
		Buckets: prometheus.ExponentialBuckets(1e-6, 2.5, 14)}, []string{"phase"})
}

// overheadClock is one exchange's timestamps for the overhead histogram.
type overheadClock struct {
	sent    bool      // before_upstream was observed (a PD retry does not count it twice)
	headers time.Time // the engine's reply headers arrived
}

// ohSent is called just before the engine call.
func (x *exchange) ohSent() {
	if !x.oh.sent {
		x.oh.sent = true
		x.g.metrics.overheadBefore.Observe(time.Since(x.start).Seconds())
	}
}

// ohHeaders is called when the engine call returned (its headers are in).
func (x *exchange) ohHeaders() { x.oh.headers = time.Now() }

// ohReplied is called once the reply was handed to fasthttp.
func (x *exchange) ohReplied() {
	if !x.oh.headers.IsZero() {
		x.g.metrics.overheadAfter.Observe(time.Since(x.oh.headers).Seconds())
	}
}

// ohStreamRead observes the processing of one upstream read that started at t.
func (x *exchange) ohStreamRead(t time.Time) {
	x.g.metrics.overheadStream.Observe(time.Since(t).Seconds())
}
