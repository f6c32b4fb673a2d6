package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// fillDomains applies n random fingerprints (distinct text) to 64 partitions whose budgets
// hold them all, in 12,583-fingerprint prompts (32k tokens), and returns the heap it took.
func fillDomains(n int) (*Domains, float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d := NewDomains(NewHasher(secret), DomainsConfig{})
	const parts = 64
	pool := int64(float64(n/parts) / (2 * FingerprintsPerToken * retentionSlack) * 1.01)
	for e := 0; e < parts; e++ {
		d.SetPool(fmt.Sprintf("e%d", e), pool)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	fps := make([]uint64, 12583)
	now := time.Unix(1e9, 0)
	for done, i := 0, 0; done < n; i++ {
		k := min(len(fps), n-done)
		for j := range fps[:k] {
			fps[j] = rng.Uint64()
		}
		d.Apply(fmt.Sprintf("t%d", i%200), fmt.Sprintf("e%d", i%parts), fps[:k], now)
		done += k
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	return d, float64(after.HeapAlloc - before.HeapAlloc)
}

// BenchmarkDomainsMemory: heap per retained fingerprint at 10^6 and 10^7 (the bound:
// 32 B), and ingest cost per fingerprint while filling.
func BenchmarkDomainsMemory(b *testing.B) {
	for _, n := range []int{1e6, 1e7} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				start := time.Now()
				d, heap := fillDomains(n)
				el := time.Since(start)
				st := d.Stats(time.Unix(1e9, 0))
				live := int64(0)
				for _, p := range st.Partitions {
					live += p.Fingerprints
				}
				b.ReportMetric(heap/float64(live), "heapB/fingerprint")
				b.ReportMetric(float64(st.TableBytes)/float64(live), "tableB/fingerprint")
				b.ReportMetric(float64(el.Nanoseconds())/float64(n), "ns/ingest")
				b.ReportMetric(float64(live), "retained")
				runtime.KeepAlive(d)
			}
		})
	}
}

// BenchmarkDomainsIngest: applying another replica's record to a partition at its budget
// (steady state: every insert evicts), per fingerprint.
func BenchmarkDomainsIngest(b *testing.B) {
	d := NewDomains(NewHasher(secret), DomainsConfig{})
	for e := 0; e < 64; e++ {
		d.SetPool(fmt.Sprintf("e%d", e), 64<<10)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	fps := make([]uint64, 4096)
	now := time.Unix(1e9, 0)
	i := 0
	for b.Loop() {
		for j := range fps {
			fps[j] = rng.Uint64()
		}
		d.Apply(fmt.Sprintf("t%d", i%200), fmt.Sprintf("e%d", i%64), fps, now)
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fps)), "ns/fingerprint")
}
