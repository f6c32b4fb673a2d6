package tokenize

import (
	"math"
	"sync"
	"testing"
)

func TestSafetyRatioDefaultsAndClamps(t *testing.T) {
	cases := []struct {
		initial, max     float64
		wantGet, wantMax float64
	}{
		{1.3, 2, 1.3, 2},
		{1.5, 1.2, 1.5, 1.5},            // max below initial: frozen at initial
		{0.5, 2, DefaultSafetyRatio, 2}, // below 1 would shrink estimates
		{math.NaN(), math.Inf(1), DefaultSafetyRatio, DefaultSafetyRatio},
		{1, 1, 1, 1},
	}
	for _, c := range cases {
		r := NewSafetyRatio(c.initial, c.max)
		if r.Get() != c.wantGet || r.Max() != c.wantMax {
			t.Errorf("NewSafetyRatio(%v, %v) = (%v, max %v), want (%v, max %v)", c.initial, c.max, r.Get(), r.Max(), c.wantGet, c.wantMax)
		}
	}
}

func TestSafetyRatioOnlyRisesUpToMax(t *testing.T) {
	r := NewSafetyRatio(1.3, 2)
	steps := []struct {
		estimate, reported int
		want               float64
	}{
		{1000, 1200, 1.3}, // under the ratio: no change
		{1000, 1400, 1.4}, // raised to what was seen
		{1000, 1, 1.4},    // a prefill-style tiny count never lowers it
		{0, 500, 1.4},     // no estimate: ignored
		{100, -3, 1.4},    // nonsense: ignored
		{1000, 5000, 2},   // capped at max
		{1000, 1500, 2},   // and stays there
	}
	for i, s := range steps {
		r.Observe(s.estimate, s.reported)
		if got := r.Get(); math.Abs(got-s.want) > 1e-12 {
			t.Fatalf("step %d Observe(%d, %d): ratio %v, want %v", i, s.estimate, s.reported, got, s.want)
		}
	}
}

func TestSafetyRatioConcurrentObserveKeepsMaximum(t *testing.T) {
	r := NewSafetyRatio(1.0, 10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				r.Observe(1000, 1000+g*1000+i) // the largest is 1000+7000+999
			}
		})
	}
	wg.Wait()
	if want := 8999.0 / 1000; math.Abs(r.Get()-want) > 1e-12 {
		t.Fatalf("ratio %v after concurrent observations, want %v", r.Get(), want)
	}
}
