package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		headroom, live int64
		want           int
	}{
		{64 << 20, 8 << 20, 800},    // a small heap: 64 MB of growth
		{64 << 20, 16 << 20, 400},   //
		{64 << 20, 32<<20 + 1, 199}, // rounded down
		{64 << 20, 64 << 20, 100},   // the default from the headroom on
		{64 << 20, 500 << 20, 100},  // a large heap: GOGC=100 as before
		{64 << 20, 3 << 20, 1600},   // the runtime's floor of 4 MB
		{64 << 20, 0, 1600},         // nothing measured yet: the same
		{256 << 20, 8 << 20, 2000},  // 3200: capped
	} {
		if got := Percent(c.headroom, c.live); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.headroom, c.live, got, c.want)
		}
	}
}

// gcPercent reads the current GOGC.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// waitFor collects until the GOGC the tuner set satisfies ok (its finalizer runs after a
// collection, on its own goroutine).
func waitFor(t *testing.T, what string, ok func(int) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
		if p := gcPercent(); ok(p) {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("GOGC %d: not %s", p, what)
		}
	}
}

// Start's tuner follows the live heap from one collection to the next: raised over a small
// heap, back to the default once the heap is larger than the headroom, raised again after.
func TestStartFollowsTheLiveHeap(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stop := Start(64 << 20)
	defer stop()
	waitFor(t, "raised over a small heap", func(p int) bool { return p > 100 })
	big := make([]*[1 << 20]byte, 96) // 96 MB live
	for i := range big {
		big[i] = new([1 << 20]byte)
	}
	waitFor(t, "the default over a heap above the headroom", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	waitFor(t, "raised again once the heap is small", func(p int) bool { return p > 100 })
	stop()
	debug.SetGCPercent(100)
	runtime.GC()
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if p := gcPercent(); p != 100 {
		t.Fatalf("GOGC %d after stop: the tuner still runs", p)
	}
}

func TestStartLeavesTheOperatorsChoice(t *testing.T) {
	t.Setenv("GOGC", "150")
	defer debug.SetGCPercent(debug.SetGCPercent(150))
	defer Start(64 << 20)()
	runtime.GC()
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if p := gcPercent(); p != 150 {
		t.Fatalf("GOGC set in the environment, and Start changed the percent to %d", p)
	}
}
