package fairqueue

import (
	"strconv"
	"testing"
)

// BenchmarkDecision is the cost of one queue decision with 16 tenants backlogged: a submit that
// waits, and a dispatch that chooses the next request and lets it go.
func BenchmarkDecision(b *testing.B) {
	q := New(Fair, 0)
	full, room := &pool{}, &pool{size: 1 << 62}
	names := make([]string, 16)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
		for j := 0; j < 4; j++ {
			q.Submit(ticket(names[i], 100), full.fits)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q.Submit(ticket(names[i%16], 100), full.fits)
		one := true
		q.Dispatch(func(t *Ticket) bool {
			if !one {
				return false
			}
			one = false
			return room.fits(t)
		})
	}
}
