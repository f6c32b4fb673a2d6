package panics

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
)

func count(where string) float64 {
	var m dto.Metric
	_ = Total.WithLabelValues(where).Write(&m)
	return m.GetCounter().GetValue()
}

// A loop that panics is noted and started again; it ends only with its context.
func TestLoopRestartsAfterPanic(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	runs := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Loop(ctx, zap.NewNop(), "test_loop", time.Millisecond, func(context.Context) {
			runs++
			if runs < 3 {
				panic("bug")
			}
			cancel()
		})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Loop did not end with its context")
	}
	if runs != 3 || count("test_loop") != 2 {
		t.Fatalf("runs %d, panics counted %v; want 3 and 2", runs, count("test_loop"))
	}
}

// Go recovers on its own goroutine: the process (this test) survives and the panic is counted.
func TestGoRecovers(t *testing.T) {
	before := count("test_go")
	done := make(chan struct{})
	Go(zap.NewNop(), "test_go", func() {
		defer close(done)
		var m map[string]int
		m["x"] = 1 // a nil-map write: a real runtime panic
	})
	<-done
	// The deferred Recover runs just after done closes.
	for deadline := time.Now().Add(5 * time.Second); count("test_go") != before+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("panic not counted")
		}
	}
}
