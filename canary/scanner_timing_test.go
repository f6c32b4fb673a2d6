package canary

import (
	"bytes"
	"fmt"
	"math/rand"
	"runtime"
	"strings"
	"testing"
	"time"
)

// benchKeyring returns a keyring with about n live markers: n/26 tenants × 26 live epochs (1 h
// epochs, 24 h window, plus the next epoch), the heap it occupies in MB and its build time in ms
// (every HMAC, done once at start).
func benchKeyring(b *testing.B, n int) (*Keyring, float64, float64) {
	b.Helper()
	tenants := make([]string, n/26)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%06d", i)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	k := NewKeyring([]byte("bench secret"), time.Hour, 24*time.Hour, tenants)
	buildMS := float64(time.Since(start).Microseconds()) / 1000
	runtime.GC()
	runtime.ReadMemStats(&after)
	return k, float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20), buildMS
}

// benchText is ~4 MB of mixed English, Go code and Chinese with, every ~2 KB, one of: the
// requester's own marker, an unknown "KVG-" string, a short "KVG-" fragment, or a lone "KVG".
func benchText(own string) []byte {
	rnd := rand.New(rand.NewSource(7))
	parts := []string{
		"The quick brown fox jumps over the lazy dog while the scheduler evicts pages. ",
		"func (s *Server) Handle(ctx context.Context, req *Request) error { return nil }\n",
		"大型语言模型的键值缓存需要仔细管理，以免不同租户之间的数据泄漏。",
		"Kernel VGA output: K V G, KV cache, KVGate gateway notes.\n",
	}
	var sb strings.Builder
	for sb.Len() < 4<<20 {
		for i := 0; i < 25; i++ {
			sb.WriteString(parts[rnd.Intn(len(parts))])
		}
		switch rnd.Intn(4) {
		case 0:
			sb.WriteString(" " + own + " ")
		case 1:
			sb.WriteString(" KVG-" + randomB32(rnd, 20) + " ")
		case 2:
			sb.WriteString(" KVG-ab ")
		case 3:
			sb.WriteString(" KVG ")
		}
	}
	return []byte(sb.String())
}

// BenchmarkScanThroughput feeds ~4 MB of text to one scanner in 4 KB events (as a streamed
// non-chat body would arrive) at 10^2, 10^4 and 10^6 live markers.
func BenchmarkScanThroughput(b *testing.B) {
	for _, n := range []int{100, 10_000, 1_000_000} {
		b.Run(fmt.Sprintf("markers=%d", n), func(b *testing.B) {
			k, heapMB, buildMS := benchKeyring(b, n)
			own, _ := k.Current("tenant-000001", time.Now())
			text := benchText(own)
			s := k.NewScanner("tenant-000001", nil)
			dst := make([]byte, 0, len(text)+4096)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dst = dst[:0]
				s.Reset("tenant-000001", nil)
				for off := 0; off < len(text); off += 4096 {
					var v Verdict
					dst, v = s.Feed(dst, text[off:min(off+4096, len(text))])
					if v.Leak != nil {
						b.Fatal("leak in benchmark text")
					}
				}
				dst = s.Flush(dst)
			}
			b.StopTimer()
			b.ReportMetric(float64(k.LiveMarkers()), "live-markers")
			b.ReportMetric(heapMB, "keyring-MB")
			b.ReportMetric(buildMS, "keyring-build-ms")
		})
	}
}

// BenchmarkBaselineIndex is the floor: bytes.Index for "KVG-" over the same text, nothing else.
func BenchmarkBaselineIndex(b *testing.B) {
	text := benchText(Marker([]byte("x"), "t", 1))
	b.SetBytes(int64(len(text)))
	for i := 0; i < b.N; i++ {
		n := 0
		for rest := text; ; {
			j := bytes.Index(rest, prefixBytes)
			if j < 0 {
				break
			}
			n++
			rest = rest[j+4:]
		}
		if n == 0 {
			b.Fatal("no KVG- in the text")
		}
	}
}

// BenchmarkRefreshEpoch is what the ticker pays when an epoch rolls over at 10^6 live markers:
// derive one epoch for every tenant and drop the oldest.
func BenchmarkRefreshEpoch(b *testing.B) {
	k, _, _ := benchKeyring(b, 1_000_000)
	now := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Hour)
		k.Refresh(now)
	}
}

// BenchmarkScanWhole scans the ~4 MB text in one Feed (a non-streaming body).
func BenchmarkScanWhole(b *testing.B) {
	for _, n := range []int{100, 10_000, 1_000_000} {
		b.Run(fmt.Sprintf("markers=%d", n), func(b *testing.B) {
			k, _, _ := benchKeyring(b, n)
			own, _ := k.Current("tenant-000001", time.Now())
			text := benchText(own)
			s := k.NewScanner("tenant-000001", nil)
			dst := make([]byte, 0, len(text)+4096)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.Reset("tenant-000001", nil)
				dst, _ = s.Feed(dst[:0], text)
				dst = s.Flush(dst)
			}
		})
	}
}

// BenchmarkScanEvent is the per-event cost of a streamed chat reply: token-sized deltas, some
// ending in "K"/"KV" (held), and an own marker arriving in pieces (stripped).
func BenchmarkScanEvent(b *testing.B) {
	for _, n := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("markers=%d", n), func(b *testing.B) {
			k, _, _ := benchKeyring(b, n)
			own, _ := k.Current("tenant-000001", time.Now())
			events := [][]byte{[]byte(" The"), []byte(" quick"), []byte(" brown"), []byte(" fox K"),
				[]byte("V cache"), []byte(" 大型"), []byte(own[:9]), []byte(own[9:]), []byte(" end.\n")}
			s := k.NewScanner("tenant-000001", nil)
			dst := make([]byte, 0, 256)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ev := events[i%len(events)]
				if i%len(events) == 0 {
					s.Reset("tenant-000001", nil)
					dst = dst[:0]
				}
				dst, _ = s.Feed(dst, ev)
			}
		})
	}
}

// BenchmarkKeyringLookup is the cost of one complete-marker lookup.
func BenchmarkKeyringLookup(b *testing.B) {
	for _, n := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("markers=%d", n), func(b *testing.B) {
			k, _, _ := benchKeyring(b, n)
			m, _ := k.Current("tenant-000002", time.Now())
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, ok := k.Lookup(m); !ok {
					b.Fatal("not found")
				}
			}
		})
	}
}
