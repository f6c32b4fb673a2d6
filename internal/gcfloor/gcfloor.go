// Package gcfloor keeps a minimum of allocation between garbage collections. With the default
// GOGC (100) the next collection starts once the heap has grown by its live size; a gateway's
// live heap is a few MB, so under load it collects several times a second, and each cycle's
// mark phase (a quarter of the CPU: half a core of two) is what the slowest requests wait
// behind. Start raises the growth to at least a fixed headroom while the live heap is small;
// once the live heap is larger than the headroom it is GOGC=100 exactly, so a large heap (many
// open streams, buffered replies) is collected as before.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// maxPercent bounds the GOGC Start sets (a live heap of a few hundred KB would ask for more).
const maxPercent = 2000

// Start sets GOGC after every collection to max(100, 100 × headroom / live heap), capped at
// maxPercent, until stop is called. It does nothing when the environment sets GOGC or
// GOMEMLIMIT (the operator's choice stands) or headroom is not positive.
func Start(headroom int64) (stop func()) {
	if headroom <= 0 || os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	t := &tuner{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.adjust()
	t.arm()
	return func() { t.stopped.Store(true) }
}

type tuner struct {
	headroom int64
	sample   []metrics.Sample // used on the finalizer goroutine only (and by Start before it)
	stopped  atomic.Bool
}

// sentinel is garbage from the moment it is made: its finalizer runs after the next collection.
type sentinel struct{ _ [16]byte }

// arm has adjust run once the next collection has ended (on the runtime's finalizer goroutine),
// and arm again.
func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		if t.stopped.Load() {
			return
		}
		t.adjust()
		t.arm()
	})
}

func (t *tuner) adjust() {
	metrics.Read(t.sample)
	debug.SetGCPercent(Percent(t.headroom, int64(t.sample[0].Value.Uint64())))
}

// minLive is the runtime's own floor: GOGC applies to a heap of at least 4 MB (before the
// first collection there is no live heap measured yet).
const minLive = 4 << 20

// Percent is the GOGC that gives at least headroom bytes of growth over a live heap of live
// bytes: never below 100 (the default), never above maxPercent.
func Percent(headroom, live int64) int {
	p := headroom * 100 / max(live, minLive)
	return int(min(max(p, 100), maxPercent))
}
