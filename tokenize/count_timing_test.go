package tokenize

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

// Benchmarks of counting, apart from the behaviour tests. Sizes are named by the prompt they
// stand for at ~0.29 tokens per byte of ordinary text (field-notes.md): 8k, 128k and 1M tokens.
// Adversarial texts have the same byte sizes (their token counts differ). Run once, e.g.
//
//	go test -run '^$' -bench . -benchtime 1x ./tokenize/

var benchSizes = []struct {
	name  string
	bytes int
}{
	{"8k", 28 << 10},
	{"128k", 448 << 10},
	{"1M", 3584 << 10},
}

var benchTexts = []struct {
	name string
	make func(size int) string
}{
	{"mixed", func(n int) string { return mixedText(99, n)[:cutAtRune(mixedText(99, n), n)] }},
	{"onechar", func(n int) string { return strings.Repeat("a", n) }},
	{"spaces", func(n int) string { return strings.Repeat(" ", n) }},
	{"special", func(n int) string { return strings.Repeat("hello <|endoftext|> ", n/20+1)[:n] }},
}

// cutAtRune returns the largest rune start <= n in s, so sized texts stay valid UTF-8.
func cutAtRune(s string, n int) int {
	if n >= len(s) {
		return len(s)
	}
	return forcedCut(s, 0, n)
}

func BenchmarkCount(b *testing.B) {
	for _, lib := range libraries {
		enc := mustEncoder(b, lib, "")
		for _, bt := range benchTexts {
			for _, sz := range benchSizes {
				text := bt.make(sz.bytes)
				b.Run(fmt.Sprintf("%s/%s/%s", lib, bt.name, sz.name), func(b *testing.B) {
					b.SetBytes(int64(len(text)))
					var n int
					for b.Loop() {
						n, _ = enc.Count(text, -1)
					}
					b.ReportMetric(float64(n), "tokens")
				})
			}
		}
	}
}

// BenchmarkCountEarlyExit is the tier-2 case that matters most: a huge prompt against a limit far
// below it. SetBytes is the whole text, so MB/s says how fast such a prompt is refused.
func BenchmarkCountEarlyExit(b *testing.B) {
	text := mixedText(98, 3584<<10)
	for _, lib := range libraries {
		enc := mustEncoder(b, lib, "")
		b.Run(lib+"/mixed/1M/stopAfter=32k", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, complete := enc.Count(text, 32768); complete {
					b.Fatal("no early exit")
				}
			}
		})
	}
}

// BenchmarkLibraryWhole counts the 8k-token texts in one tiktoken-go call, without our
// chunking: what the chunking costs on ordinary text.
func BenchmarkLibraryWhole(b *testing.B) {
	codec, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		b.Fatal(err)
	}
	for _, bt := range benchTexts {
		text := bt.make(benchSizes[0].bytes)
		b.Run(LibraryTiktokenGo+"/"+bt.name+"/8k", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, err := codec.Count(text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRenderChatML(b *testing.B) {
	msgs := []Message{{Role: "system", Content: englishText(97, 2000)}, {Role: "user", Name: "bob", Content: mixedText(97, 30000)}}
	b.SetBytes(int64(len(RenderChatML(msgs, ""))))
	for b.Loop() {
		_ = RenderChatML(msgs, "")
	}
}
