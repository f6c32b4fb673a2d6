package tokenize

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

// knownTiktokenGoSplit reports whether text has a whitespace run in which a newline is followed
// by other whitespace and then a newline again, such as "\n\t\n": tiktoken-go/tokenizer v0.10.0's
// compiled pattern cuts such a run where Python's tiktoken (and the regex it implements, checked
// with an interpreting regex engine in tokenize/bpe) keeps it whole: "\n\t\n" is 1 token for
// OpenAI's tiktoken, 2 for tiktoken-go. kvgate's counter gives Python's count; on such texts
// tiktoken-go is no reference.
func knownTiktokenGoSplit(text string) bool {
	seenNL, seenOther := false, false
	for _, r := range text {
		switch {
		case r == '\n' || r == '\r':
			if seenNL && seenOther {
				return true
			}
			seenNL, seenOther = true, false
		case isSpace(r):
			if seenNL {
				seenOther = true
			}
		default:
			seenNL, seenOther = false, false
		}
	}
	return false
}

func TestKvgateEqualsTiktokenGo(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	texts := []string{"", "hello world", trickyText, englishText(1, 20000), mixedText(2, 60000), strings.Repeat("a", 100000),
		strings.Repeat(" ", 100000), strings.Repeat("hello <|endoftext|> ", 500), strings.Repeat("😀", 3000),
		"x" + strings.Repeat(" ", 5000) + "y", strings.Repeat("=", 50000), "it's WE'LL don't x's"}
	for _, s := range CalibrationSamples {
		texts = append(texts, s.Text)
	}
	alphabet := []string{"a", "B", "1", " ", "  ", "\t", "\n", "'s", "!", ".", "中", "😀", "é", "\u00a0", "ab", "the", " the"}
	for range 500 {
		var b strings.Builder
		for range 1 + r.IntN(80) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		texts = append(texts, b.String())
	}
	for _, enc := range []string{EncodingCl100k, EncodingO200k} {
		ours := mustEncoder(t, LibraryKvgate, enc)
		codec, err := tokenizer.Get(tokenizer.Encoding(enc))
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, text := range texts {
			if knownTiktokenGoSplit(text) {
				continue
			}
			want, _ := codec.Count(text)
			got, complete := ours.Count(text, -1)
			if got != want || !complete {
				t.Fatalf("%s: Count(%.80q…) = %d, %v; tiktoken-go %d", enc, text, got, complete, want)
			}
			checked++
		}
		if checked < len(texts)/2 {
			t.Fatalf("%s: only %d of %d texts checked", enc, checked, len(texts))
		}
	}
}

// TestKvgateNewlineRun pins the one difference with tiktoken-go: Python's tiktoken counts
// "\n\t\n" as 1 cl100k_base token (its pre-tokenizer keeps the run whole, `\s*[\r\n]+`).
func TestKvgateNewlineRun(t *testing.T) {
	for _, enc := range []string{EncodingCl100k, EncodingO200k} {
		if n, _ := mustEncoder(t, LibraryKvgate, enc).Count("\n\t\n", -1); n != 1 {
			t.Errorf("%s: Count(\"\\n\\t\\n\") = %d, want 1 (OpenAI's tiktoken)", enc, n)
		}
	}
}

func TestKvgateEarlyExit(t *testing.T) {
	enc := mustEncoder(t, LibraryKvgate, "")
	text := mixedText(7, 200000)
	exact, _ := enc.Count(text, -1)
	for _, stop := range []int{0, 1, 100, exact - 1, exact, exact + 1} {
		n, complete := enc.Count(text, stop)
		if stop >= exact {
			if n != exact || !complete {
				t.Fatalf("Count(text, %d) = %d, %v; exact %d", stop, n, complete, exact)
			}
		} else if n <= stop || complete || n > stop+64 {
			t.Fatalf("Count(text, %d) = %d, %v; want a little over %d, incomplete", stop, n, complete, stop)
		}
	}
}

// BenchmarkKvgateVsTiktokenGo counts the same texts with kvgate's counter and tiktoken-go's
// Count, side by side (MB/s): prose, one repeated character, spaces; 28 KiB (an 8k prompt) and
// 448 KiB.
func BenchmarkKvgateVsTiktokenGo(b *testing.B) {
	ours := mustEncoder(b, LibraryKvgate, "")
	codec, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		b.Fatal(err)
	}
	for _, bt := range benchTexts {
		for _, sz := range benchSizes[:2] {
			text := bt.make(sz.bytes)
			b.Run(fmt.Sprintf("kvgate/%s/%s", bt.name, sz.name), func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				for b.Loop() {
					ours.Count(text, -1)
				}
			})
			b.Run(fmt.Sprintf("tiktoken-go/%s/%s", bt.name, sz.name), func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := codec.Count(text); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
