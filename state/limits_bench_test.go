package state_test

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
)

// BenchmarkAdmit compares one admission (check and charge rpm, tpm and a concurrency slot, then
// settle) against the memory store and against Redis (one script call to admit, one to settle).
// limits.Rates are high enough that every request is admitted.
func BenchmarkAdmit(b *testing.B) {
	lim := limits.Rates{RPM: 1 << 30, TPM: 1 << 30, MaxConcurrent: 1 << 20}
	run := func(b *testing.B, l *limits.Limiter) {
		b.ReportAllocs()
		for b.Loop() {
			tk, v := l.Admit("bench", lim, 300)
			if !v.Allowed {
				b.Fatalf("refused: %+v", v)
			}
			l.Settle(tk, 250)
		}
	}
	b.Run("memory", func(b *testing.B) { run(b, limits.NewLimiter(nil, 1, 0)) })
	b.Run("redis", func(b *testing.B) {
		client, prefix := testRedis(b)
		l := limits.NewLimiter(state.NewRedisLimits(client, prefix), 1, time.Second)
		run(b, l)
		if l.Degraded() {
			b.Fatal("Redis calls failed during the benchmark")
		}
	})
	// Admission alone (no settle, no concurrency slot): the one round trip on the request path.
	rate := limits.Rates{RPM: 1 << 30, TPM: 1 << 30}
	b.Run("memory/admit-only", func(b *testing.B) {
		l := limits.NewLimiter(nil, 1, 0)
		b.ReportAllocs()
		for b.Loop() {
			l.Admit("bench", rate, 300)
		}
	})
	b.Run("redis/admit-only", func(b *testing.B) {
		client, prefix := testRedis(b)
		l := limits.NewLimiter(state.NewRedisLimits(client, prefix), 1, time.Second)
		b.ReportAllocs()
		for b.Loop() {
			l.Admit("bench", rate, 300)
		}
	})
}
