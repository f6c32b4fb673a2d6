package fingerprint

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Cost per prompt byte of fingerprinting (the hash, the sample and the own-text filter) and of
// keeping the sample in the index, and per reply byte of the scan; memory per prompt byte as the
// index holds it (heap measured after a GC).
func BenchmarkPrompt(b *testing.B) {
	h := NewHasher(secret)
	text := words(1, 20000) // ~110 KB
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		h.Prompt(text)
	}
}

func BenchmarkRecord(b *testing.B) {
	h := NewHasher(secret)
	texts := make([]string, 64)
	for i := range texts {
		texts[i] = words(uint64(i), 2000) // ~11 KB each
	}
	ix := NewIndex(h, Config{MaxBytes: 1 << 40})
	b.SetBytes(int64(len(texts[0])))
	i := 0
	for b.Loop() {
		fps, _ := h.Prompt(texts[i%len(texts)])
		ix.Record(fmt.Sprintf("t%d", i%500), []string{"p0", "d0"}, fps, time.Unix(int64(i), 0))
		i++
	}
}

// BenchmarkIndexMemory fills an index with distinct prompts and reports its heap per prompt byte
// and per fingerprint, and the accounted bytes per fingerprint (BytesPerFingerprint).
func BenchmarkIndexMemory(b *testing.B) {
	h := NewHasher(secret)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ix := NewIndex(h, Config{MaxBytes: 1 << 40})
		promptBytes := 0
		for i := 0; i < 400; i++ {
			text := words(uint64(1000+i), 2000)
			promptBytes += len(text)
			fps, _ := h.Prompt(text)
			ix.Record(fmt.Sprintf("t%d", i%200), []string{"p0", "d0"}, fps, time.Unix(int64(i), 0))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap := float64(after.HeapAlloc - before.HeapAlloc)
		st := ix.Stats()
		b.ReportMetric(heap/float64(promptBytes), "heapB/promptB")
		b.ReportMetric(heap/float64(st.Fingerprints), "heapB/fingerprint")
		b.ReportMetric(float64(st.Bytes)/float64(promptBytes), "accountedB/promptB")
		runtime.KeepAlive(ix)
	}
}

func BenchmarkScanReply(b *testing.B) {
	h := NewHasher(secret)
	ix := NewIndex(h, Config{MaxBytes: 1 << 40})
	for i := 0; i < 200; i++ {
		fps, _ := h.Prompt(words(uint64(i), 2000))
		ix.Record(fmt.Sprintf("t%d", i), []string{"p0", "d0"}, fps, time.Unix(0, 0))
	}
	_, own := h.Prompt(words(5000, 2000))
	reply := words(6000, 400) // ~2 KB of text no one sent, fed as 8-byte deltas
	b.SetBytes(int64(len(reply)))
	for b.Loop() {
		sc := ix.NewScanner("z", []string{"p0", "d0"}, own)
		for j := 0; j < len(reply); j += 8 {
			sc.Feed(reply[j:min(j+8, len(reply))])
		}
	}
}
