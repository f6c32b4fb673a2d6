// Package panics keeps a panic inside the unit of work it happened in: an exchange, a stream
// read, a poll, a background write. A recovered panic is logged with its stack and counted in
// kvgate_panics_total{where}; the process lives. It must never swallow a panic silently.
package panics

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Total counts recovered panics by where they happened. It is process-wide (a panic is a bug in
// the binary, not in one gateway instance); each gateway registers it with its own registry.
var Total = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_panics_total",
	Help: "Panics recovered, by where (request, stream, poll, background). Any is a bug: the request it hit got a 500."},
	[]string{"where"})

// Note records a recovered value v (non-nil) from where.
func Note(log *zap.Logger, where string, v any) {
	Total.WithLabelValues(where).Inc()
	if log != nil {
		log.Error("panic recovered", zap.String("where", where), zap.String("panic", fmt.Sprint(v)),
			zap.ByteString("stack", debug.Stack()))
	}
}

// Recover is deferred directly: `defer panics.Recover(log, "where")`. It stops a panic, notes it,
// and returns nothing to the caller; use it where nothing else needs undoing.
func Recover(log *zap.Logger, where string) {
	if v := recover(); v != nil {
		Note(log, where, v)
	}
}

// Go runs fn on its own goroutine under Recover.
func Go(log *zap.Logger, where string, fn func()) {
	go func() {
		defer Recover(log, where)
		fn()
	}()
}

// Loop runs fn until ctx ends; a panic in fn is noted and fn starts again after pause, so a
// background loop (polling, syncing) survives a reading that trips a bug.
func Loop(ctx context.Context, log *zap.Logger, where string, pause time.Duration, fn func(context.Context)) {
	for {
		if !runOnce(log, where, ctx, fn) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
	}
}

// runOnce says whether fn panicked (and so should run again).
func runOnce(log *zap.Logger, where string, ctx context.Context, fn func(context.Context)) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			Note(log, where, v)
			panicked = true
		}
	}()
	fn(ctx)
	return false
}
