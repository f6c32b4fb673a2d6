package canary

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkLooseFeed feeds the ~4 MB benchmark text (prose, Go code, Chinese, the requester's own
// marker and unknown "KVG-" strings) to one folded-text detector in 4 KB events, at 10^2, 10^4 and
// 10^5 live markers. keyring-MB is the heap the keyring holds (markers, prefixes and windows).
func BenchmarkLooseFeed(b *testing.B) {
	for _, n := range []int{100, 10_000, 100_000} {
		b.Run(fmt.Sprintf("markers=%d", n), func(b *testing.B) {
			k, heapMB, _ := benchKeyring(b, n)
			own, _ := k.Current("tenant-000001", time.Now())
			text := benchText(own)
			l := k.NewLoose("tenant-000001", nil)
			dst := make([]byte, 0, len(text)+4096)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dst = dst[:0]
				l.Reset("tenant-000001", nil)
				for off := 0; off < len(text); off += 4096 {
					var h *Hit
					dst, h = l.Feed(dst, text[off:min(off+4096, len(text))])
					if h != nil {
						b.Fatalf("hit in benchmark text: %+v", h)
					}
				}
				dst, _ = l.Flush(dst)
			}
			b.StopTimer()
			b.ReportMetric(float64(k.LiveMarkers()), "live-markers")
			b.ReportMetric(heapMB, "keyring-MB")
		})
	}
}

// BenchmarkScannerSideBySide: the folded detector as it is (HoldMin windows in an open-addressed
// table; separators, references, look-alikes and reversal read) and as it was on main before
// issue 17 (legacy_loose_test.go), on the same ~4 MB text in 4 KB events, from 10^2 to 10^6 live
// markers, in one run (make bench-scanner; numbers in BENCHMARKS.md).
func BenchmarkScannerSideBySide(b *testing.B) {
	for _, n := range []int{100, 10_000, 100_000, 1_000_000} {
		k, heapMB, _ := benchKeyring(b, n)
		own, _ := k.Current("tenant-000001", time.Now())
		text := benchText(own)
		b.Run(fmt.Sprintf("today/markers=%d", n), func(b *testing.B) {
			feedInEvents(b, k.NewLoose("tenant-000001", nil), text)
			b.ReportMetric(heapMB, "keyring-MB")
		})
		b.Run(fmt.Sprintf("before/markers=%d", n), func(b *testing.B) {
			feedInEvents(b, newLegacyLoose(k, "tenant-000001"), text)
		})
	}
}

// looseFeeder is what the side-by-side benchmark drives: the detector today and before.
type looseFeeder interface {
	Reset(tenant string, echoes []string)
	Feed(dst, text []byte) ([]byte, *Hit)
}

// feedInEvents feeds text through l in 4 KB events, b.N times; any hit fails the benchmark.
func feedInEvents(b *testing.B, l looseFeeder, text []byte) {
	dst := make([]byte, 0, len(text)+4096)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Reset("tenant-000001", nil)
		for off := 0; off < len(text); off += 4096 {
			var h *Hit
			if dst, h = l.Feed(dst[:0], text[off:min(off+4096, len(text))]); h != nil {
				b.Fatalf("hit in benchmark text: %+v", h)
			}
		}
	}
}
