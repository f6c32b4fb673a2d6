package tokenize

import (
	"math"
	"sync/atomic"
)

// DefaultSafetyRatio is DESIGN.md's default fallback multiplier.
const DefaultSafetyRatio = 1.3

// SafetyRatio is the fallback multiplier applied to an estimate when no exact count is available.
// It only ever rises (up to its max), learning from prompt_tokens counts that engines reported for
// prompts we estimated. Safe for concurrent use; the zero value is not usable (use NewSafetyRatio).
type SafetyRatio struct {
	bits atomic.Uint64 // math.Float64bits of the current ratio
	max  float64
}

// NewSafetyRatio returns a ratio starting at initial that Observe may raise up to max.
// An initial value that is not finite or below 1 is replaced by DefaultSafetyRatio: a ratio below
// 1 would shrink estimates, and the ratio exists to cover under-estimates. A max below the initial
// value (or not finite) is raised to it, so the ratio can then never move.
func NewSafetyRatio(initial, max float64) *SafetyRatio {
	if math.IsNaN(initial) || math.IsInf(initial, 0) || initial < 1 {
		initial = DefaultSafetyRatio
	}
	if math.IsNaN(max) || math.IsInf(max, 0) || max < initial {
		max = initial
	}
	r := &SafetyRatio{max: max}
	r.bits.Store(math.Float64bits(initial))
	return r
}

// Get returns the current ratio.
func (r *SafetyRatio) Get() float64 { return math.Float64frombits(r.bits.Load()) }

// Max returns the cap that Observe never raises the ratio past.
func (r *SafetyRatio) Max() float64 { return r.max }

// Observe raises the ratio to reported/estimate (capped at max) when that is above the current
// ratio. reported must be a prompt_tokens count that a unified or decode engine reported for a
// prompt whose estimate was estimate: a buggy prefill reports 1 token, so callers never feed
// prefill replies, and because the ratio only rises such a reply could not lower it anyway.
// Non-positive values are ignored.
func (r *SafetyRatio) Observe(estimate, reported int) {
	if estimate <= 0 || reported <= 0 {
		return
	}
	want := math.Min(float64(reported)/float64(estimate), r.max)
	for {
		old := r.bits.Load()
		if want <= math.Float64frombits(old) {
			return
		}
		if r.bits.CompareAndSwap(old, math.Float64bits(want)) {
			return
		}
	}
}
