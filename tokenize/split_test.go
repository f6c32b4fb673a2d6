package tokenize

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"
)

func TestIsSafeBoundary(t *testing.T) {
	// Each case marks the cut with '|': the byte after it is i.
	cases := []struct {
		marked string
		want   bool
	}{
		{"hello| world", true},    // space after a letter
		{"x.| y", true},           // space after punctuation
		{"x | y", false},          // inside a whitespace run: "\s+(?!\S)" keeps runs whole
		{"x\u00a0| y", false},     // after a no-break space (regex whitespace)
		{"x\u3000| y", false},     // after an ideographic space
		{"word|\nnext", true},     // newline after a letter
		{"42|\nnext", true},       // newline after a digit
		{"word.|\n\nnext", false}, // punctuation absorbs following newlines
		{"word |\nnext", false},
		{"foo|(x)", true},    // punctuation after a letter
		{"日本|。次", true},      // full-width punctuation after an ideograph
		{"don|'t", false},    // o200k keeps contractions with their word
		{"e\u0301|x", false}, // letters never start a piece
		{"e|\u0301x", false}, // nor marks (o200k words include them)
		{"x1|.", false},      // punctuation after a digit: not needed, not taken
		{"a|b", false},
		{"中|文", false},
		{"\t|x", false},
	}
	for _, c := range cases {
		i := strings.IndexByte(c.marked, '|')
		s := c.marked[:i] + c.marked[i+1:]
		if got := isSafeBoundary(s, i); got != c.want {
			t.Errorf("isSafeBoundary(%q, %d) = %v, want %v", s, i, got, c.want)
		}
	}
	// Never inside a rune, whatever the text.
	s := chineseText(7, 4000) + "é ü ß"
	for i := 1; i < len(s); i++ {
		if isSafeBoundary(s, i) && !utf8.RuneStart(s[i]) {
			t.Fatalf("boundary inside a rune at %d", i)
		}
	}
}

// trickyText gathers the places where a careless cut would change a pre-token.
const trickyText = "it's don't WE'LL x's y. word.\n\nNext ABC/def e\u0301 x x\u00a0 y foo  bar\t x a\r\nb " +
	"123 4567 89, <|endoftext|>hello <|im_start|>user\n café\n 日本語。次の文、テスト！ " +
	"a\u3000b ß. http://example.test/a/b?c=d\n\t\tif x != nil {\n\t\treturn\n\t}\n" +
	"   leading spaces\n\n\n  trailing  \n"

// Cutting at every safe boundary, not just the ones Count picks, must leave the count unchanged
// for both encodings: that is the claim chunked counting rests on.
func TestEveryBoundaryPreservesCount(t *testing.T) {
	text := trickyText + mixedText(11, 60000) + trickyText
	for _, enc := range []tokenizer.Encoding{tokenizer.Cl100kBase, tokenizer.O200kBase} {
		codec, err := tokenizer.Get(enc)
		if err != nil {
			t.Fatal(err)
		}
		whole, _ := codec.Count(text)
		sum, pieces, start := 0, 0, 0
		for i := 1; i <= len(text); i++ {
			if i == len(text) || isSafeBoundary(text, i) {
				n, _ := codec.Count(text[start:i])
				sum += n
				pieces++
				start = i
			}
		}
		if pieces < len(text)/20 {
			t.Fatalf("%s: only %d boundaries in %d bytes", enc, pieces, len(text))
		}
		if sum != whole {
			t.Fatalf("%s: sum over %d pieces = %d, whole text = %d", enc, pieces, sum, whole)
		}
	}
}

func TestNextCut(t *testing.T) {
	texts := []string{
		strings.Repeat("a", 10000), // no boundary at all: forced cuts
		strings.Repeat("é", 5000),  // forced cuts must land on rune starts
		strings.Repeat("中", 4000),
		mixedText(3, 20000),
		strings.Repeat(" ", 9000) + "x",
		strings.Repeat("word ", 300) + strings.Repeat("b", 700) + strings.Repeat(" w", 500),
	}
	for _, s := range texts {
		for _, sz := range [][2]int{{1024, 1024}, {256, 256}, {256, 4096}} {
			target, maxRun := sz[0], sz[1]
			for start := 0; start < len(s); {
				end := nextCut(s, start, target, maxRun)
				if end <= start || end > len(s) {
					t.Fatalf("nextCut(%d) = %d: no progress or past the end (len %d)", start, end, len(s))
				}
				if end < len(s) && !utf8.RuneStart(s[end]) {
					t.Fatalf("cut at %d is inside a rune", end)
				}
				// No run without a safe boundary longer than maxRun inside a piece.
				run := start
				for i := start + 1; i <= end; i++ {
					if i == end || isSafeBoundary(s, i) {
						if i-run > maxRun {
							t.Fatalf("target %d maxRun %d: run [%d,%d) inside piece [%d,%d)", target, maxRun, run, i, start, end)
						}
						run = i
					}
				}
				if end-start > maxRun {
					t.Fatalf("piece of %d bytes > maxRun %d", end-start, maxRun)
				}
				if end < len(s) && end-start > target && isSafeBoundary(s, end) {
					// A long piece is only allowed when nothing within target could end it.
					for i := start + 1; i <= start+target; i++ {
						if isSafeBoundary(s, i) {
							t.Fatalf("piece [%d,%d) longer than target though %d is a boundary", start, end, i)
						}
					}
				}
				start = end
			}
		}
	}
}
