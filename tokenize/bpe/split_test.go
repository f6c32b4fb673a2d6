package bpe

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// regexPieces splits s with a backtracking regex engine (regexp2, .NET semantics, whose \s is
// the same White_Space set): the reference the hand-written splitter must equal. One known
// difference is left out of the inputs: regexp2's (?i:'s) does not match "'ſ" (U+017F, which
// case-folds to s), where Python's regex, Rust's regex and Oniguruma, JavaScript's /iu and
// tiktoken-go's own compiled pattern ([STstſ]) all do; the splitter follows them
// (TestLongSContraction).
func regexPieces(t testing.TB, re *regexp2.Regexp, s string) []string {
	var out []string
	m, err := re.FindStringMatch(s)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		out = append(out, m.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func splitPieces(sp *Splitter, s string) []string {
	var out []string
	for i := 0; i < len(s); {
		j := sp.Next(s, i)
		if j <= i {
			panic("no progress")
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

// splitCorpus is text meant to reach every branch of the patterns.
var splitCorpus = []string{
	"", "hello world", "Hello, World! It's we'll I'M you'RE they've he'd 'll 'x '", "\n\t\n", "a\n\t\nb",
	"x   y", "x  \t y", "  \n  \n  z", "\r\n\r\n", "end   ", " ", "  ", "12345678 1 22 333 4444",
	"١٢٣٤ ½⅓ Ⅻ", "中文。测试，好的！", "日本語のテキスト", "한국어 텍스트", "emoji 😀👍🏽 🇫🇷", "a\u0301b\u0301 \u0301x",
	"x\u00a0 y\u2003z\u3000w\u0085v\ufeffu", "CamelCaseWord HTTPServer iPhone McDONALD's DON'T", "ǅungla ǈ",
	"path/to/file.go // comment\n\n/* x */", "foo!!!\n\n\nbar", "  !!!", " !?\n", "\t\tif err != nil {\n\t\t\treturn\n\t\t}",
	"'S'T'RE'VE'M'LL'D", "ʰello ʰʰ", "ΑΒΓαβγ", "x'", "x'r", "x'l", "\u0301\u0301", " \u0301a", "!\u0301ab",
	strings.Repeat("a", 300), strings.Repeat(" ", 300), strings.Repeat(" ", 30) + "x", strings.Repeat("\n ", 30),
}

var splitAlphabet = []string{"a", "B", "z", "Z", "1", "9", "٣", " ", "  ", "\t", "\n", "\r", "\r\n", "'", "'s", "'LL", "'re",
	"!", ".", "/", "-", "中", "。", "😀", "\u0301", "\u00a0", "\u2003", "\u0085", "ǅ", "ʰ", "é", "É", "$", "_", "\v", "\f"}

func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(splitAlphabet[r.IntN(len(splitAlphabet))])
	}
	return b.String()
}

func TestSplitterEqualsRegex(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, pattern := range []string{PatternCl100k, PatternQwen2, PatternO200k} {
		sp, err := NewSplitter(pattern)
		if err != nil {
			t.Fatal(err)
		}
		re := regexp2.MustCompile(pattern, regexp2.None)
		texts := append([]string(nil), splitCorpus...)
		for range 3000 {
			texts = append(texts, randomText(r, 1+r.IntN(24)))
		}
		for _, s := range texts {
			want, got := regexPieces(t, re, s), splitPieces(sp, s)
			if strings.Join(want, "|") != strings.Join(got, "|") || len(want) != len(got) {
				t.Fatalf("pattern %.20q… text %q:\n got %q\nwant %q", pattern, s, got, want)
			}
		}
	}
}

func TestSplitterRefusesUnknownPatterns(t *testing.T) {
	if _, err := NewSplitter(`\s+|\w+`); err == nil || !strings.Contains(err.Error(), "unsupported pre-tokenizer pattern") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzSplitter(f *testing.F) {
	for _, s := range splitCorpus {
		f.Add(s)
	}
	var sps []*Splitter
	var res []*regexp2.Regexp
	for _, p := range []string{PatternCl100k, PatternQwen2, PatternO200k} {
		sp, _ := NewSplitter(p)
		sps, res = append(sps, sp), append(res, regexp2.MustCompile(p, regexp2.None))
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for k, sp := range sps {
			want, got := regexPieces(t, res[k], s), splitPieces(sp, s)
			if strings.Join(want, "\x00|") != strings.Join(got, "\x00|") {
				t.Fatalf("pattern %d text %q:\n got %q\nwant %q", k, s, got, want)
			}
		}
	})
}

func TestLongSContraction(t *testing.T) {
	sp, _ := NewSplitter(PatternCl100k)
	if got := splitPieces(sp, "x'ſé"); strings.Join(got, "|") != "x|'ſ|é" {
		t.Fatalf("got %q", got)
	}
}
