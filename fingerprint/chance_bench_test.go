package fingerprint

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// BenchmarkChanceMatchesOnRepoText measures false evidence on real text that tenants share
// without it being boilerplate: this repository's Go sources and documents, every other file sent
// as a prompt by a tenant of its own, the rest read (first 2 KB) as replies of a tenant that sent
// none of them. Files of one project share long runs (import blocks, sentences repeated across
// documents) with one or two others, which the detector cannot tell from a leak: the reported
// share of replies cut is the cost of same-organisation text under several tenant keys
// (documented in SECURITY.md and DESIGN.md).
func BenchmarkChanceMatchesOnRepoText(b *testing.B) {
	for b.Loop() {
		chanceMatches(b)
	}
}

func chanceMatches(t *testing.B) {
	var files []string
	root := filepath.Join("..")
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	sort.Strings(files)
	if len(files) < 100 {
		t.Fatalf("only %d files found", len(files))
	}
	h := NewHasher(secret)
	ix := NewIndex(h, Config{MaxBytes: 1 << 30, CutMatches: 1 << 30})
	now := time.Unix(1e9, 0)
	var prompts, replies []string
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			prompts = append(prompts, string(b))
			fps, _ := h.Prompt(string(b))
			ix.Record(f, []string{"u0"}, fps, now)
		} else {
			replies = append(replies, string(b))
		}
	}
	hist := map[int]int{}
	worst, bytes := 0, 0
	sameVictim3, sameVictim4 := 0, 0
	for _, r := range replies {
		r = r[:min(len(r), 2048)] // a reply's first 2 KB, where a cut must come
		bytes += len(r)
		sc := ix.NewScanner("reader", []string{"u0"}, nil)
		sc.Feed(r)
		n := sc.Count()
		switch {
		case n == 0:
			hist[0]++
		case n < 3:
			hist[1]++
		default:
			hist[3]++
		}
		worst = max(worst, n)
		best := 0
		for _, c := range sc.perVictim {
			best = max(best, c)
		}
		if best >= 3 {
			sameVictim3++
		}
		if best >= 4 {
			sameVictim4++
		}
	}
	t.ReportMetric(float64(len(replies)), "replies")
	t.ReportMetric(100*float64(hist[0])/float64(len(replies)), "%none")
	t.ReportMetric(100*float64(hist[1])/float64(len(replies)), "%weak")
	t.ReportMetric(100*float64(hist[3])/float64(len(replies)), "%cut")
	t.ReportMetric(100*float64(sameVictim3)/float64(len(replies)), "%cut-one-victim")
	t.ReportMetric(float64(worst), "max-matches")
}
