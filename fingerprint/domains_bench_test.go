package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// fillDomains applies n random fingerprints (distinct text) to 64 partitions whose budgets
// hold them all, in prompts of up to 12,583 fingerprints (32k tokens), and returns the heap it
// took.
func fillDomains(n int) (*Domains, float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	d := NewDomains(NewHasher(secret), DomainsConfig{NoShippedPublicText: true}) // a fixed cost, counted apart
	const parts = 64
	pool := int64(float64(n/parts) / (2 * FingerprintsPerToken * retentionSlack) * 1.01)
	for e := 0; e < parts; e++ {
		d.SetPool(fmt.Sprintf("e%d", e), pool)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	fps := make([]uint64, min(12583, n/parts/4)) // every partition gets n/parts
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
	d := NewDomains(NewHasher(secret), DomainsConfig{NoShippedPublicText: true})
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

// BenchmarkScanSideBySide: the same 2 KB reply, in 8-byte pieces, scanned against the same
// prompts kept in today's Index and in the Domains (route p0+d0, both partitions holding them),
// at two sizes (200 and 2,000 prompts of 11 KB: about 0.2 M and 2 M fingerprints), in one run.
func BenchmarkScanSideBySide(b *testing.B) {
	h := NewHasher(secret)
	for _, prompts := range []int{200, 2000} {
		ix := NewIndex(h, Config{MaxBytes: 1 << 40})
		d := NewDomains(h, DomainsConfig{})
		d.SetPool("p0", 1<<30)
		d.SetPool("d0", 1<<30)
		for i := 0; i < prompts; i++ {
			fps, _ := h.Prompt(words(uint64(i), 2000))
			d.Record(fmt.Sprintf("t%d", i), []string{"p0", "d0"}, fps, time.Unix(0, 0))
			ix.Record(fmt.Sprintf("t%d", i), []string{"p0", "d0"}, fps, time.Unix(0, 0))
		}
		_, own := h.Prompt(words(5000, 2000))
		reply := words(6000, 400)
		scan := func(b *testing.B, newScanner func() *Scanner) {
			b.SetBytes(int64(len(reply)))
			for b.Loop() {
				sc := newScanner()
				for j := 0; j < len(reply); j += 8 {
					sc.Feed(reply[j:min(j+8, len(reply))])
				}
			}
		}
		b.Run(fmt.Sprintf("prompts=%d/index", prompts), func(b *testing.B) {
			scan(b, func() *Scanner { return ix.NewScanner("z", []string{"p0", "d0"}, own) })
		})
		b.Run(fmt.Sprintf("prompts=%d/domains", prompts), func(b *testing.B) {
			scan(b, func() *Scanner { return d.NewScanner("z", []string{"p0", "d0"}, own) })
		})
	}
}

// BenchmarkIngestSideBySide: another replica's 4,096-fingerprint records applied at steady
// state (every insert evicts) to today's Index (one cap for the fleet, sized like the 64
// partitions together) and to the Domains (64 partitions of 64k-token pools), per fingerprint,
// in one run.
func BenchmarkIngestSideBySide(b *testing.B) {
	h := NewHasher(secret)
	d := NewDomains(h, DomainsConfig{NoShippedPublicText: true})
	for e := 0; e < 64; e++ {
		d.SetPool(fmt.Sprintf("e%d", e), 64<<10)
	}
	ix := NewIndex(h, Config{MaxBytes: 64 * d.Budget(64<<10) * BytesPerFingerprint})
	rng := rand.New(rand.NewPCG(1, 1))
	fps := make([]uint64, 4096)
	now := time.Unix(1e9, 0)
	run := func(b *testing.B, apply func(i int)) {
		for i := 0; i < 3000; i++ { // fill to the budget first
			apply(i)
		}
		i := 0
		for b.Loop() {
			apply(i)
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(fps)), "ns/fingerprint")
	}
	b.Run("index", func(b *testing.B) {
		run(b, func(i int) {
			for j := range fps {
				fps[j] = rng.Uint64()
			}
			ix.Record(fmt.Sprintf("t%d", i%200), []string{fmt.Sprintf("e%d", i%64)}, slices.Clone(fps), now)
		})
	})
	b.Run("domains", func(b *testing.B) {
		run(b, func(i int) {
			for j := range fps {
				fps[j] = rng.Uint64()
			}
			d.Apply(fmt.Sprintf("t%d", i%200), fmt.Sprintf("e%d", i%64), fps, now)
		})
		st, live := d.Stats(now), int64(0)
		for _, p := range st.Partitions {
			live += p.Fingerprints
		}
		b.ReportMetric(float64(st.TableBytes)/float64(live), "tableB/fingerprint") // dead entries included
	})
}
