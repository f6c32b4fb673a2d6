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
	for i, outer := 0, 0; i < len(s); {
		if i == outer {
			outer = sp.Outer(s, i)
		}
		j := sp.Next(s[:outer], i)
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

// splitCases are the splitters under test, each with its pattern or sequence of patterns.
var splitCases = [][]string{{PatternCl100k}, {PatternQwen2}, {PatternO200k}, {PatternDeepSeekDigits, PatternDeepSeekCJK, PatternDeepSeekWords}}

// isolatedPieces applies each pattern in turn as a Split with behavior Isolated (Hugging Face's
// pre-tokenizer Sequence): every piece so far is cut into its matches and the text between them.
func isolatedPieces(t testing.TB, res []*regexp2.Regexp, s string) []string {
	pieces := []string{s}
	for _, re := range res {
		var next []string
		for _, p := range pieces {
			rs := []rune(p) // regexp2 indexes runes
			at := 0
			m, err := re.FindRunesMatch(rs)
			for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
				if m.Index > at {
					next = append(next, string(rs[at:m.Index]))
				}
				next = append(next, string(rs[m.Index:m.Index+m.Length]))
				at = m.Index + m.Length
			}
			if err != nil {
				t.Fatal(err)
			}
			if at < len(rs) {
				next = append(next, string(rs[at:]))
			}
		}
		pieces = next
	}
	return pieces
}

func compileAll(patterns []string) []*regexp2.Regexp {
	var res []*regexp2.Regexp
	for _, p := range patterns {
		res = append(res, regexp2.MustCompile(p, regexp2.None))
	}
	return res
}

// sequenceAlphabet adds what DeepSeek V3's steps single out: kana (with the katakana block's
// punctuation U+30A0 and U+30FB and its letter-modifier U+30FC), a Han character outside the
// CJK step's range (U+9FA6), a number that is not a digit, a format character (no alternative
// matches it), ASCII punctuation before ASCII letters.
var sequenceAlphabet = append(append([]string(nil), splitAlphabet...), "あ", "ア", "・", "゠", "ー", "龦", "²", "​", "\x00", "(a", ".Net", "#x", "ab")

func TestSplitterEqualsRegex(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, patterns := range splitCases {
		sp, err := NewSequenceSplitter(patterns)
		if err != nil {
			t.Fatal(err)
		}
		res := compileAll(patterns)
		texts := append([]string(nil), splitCorpus...)
		alphabet := splitAlphabet
		if len(patterns) > 1 {
			alphabet = sequenceAlphabet
		}
		for range 3000 {
			var b strings.Builder
			for range 1 + r.IntN(24) {
				b.WriteString(alphabet[r.IntN(len(alphabet))])
			}
			texts = append(texts, b.String())
		}
		for _, s := range texts {
			want, got := isolatedPieces(t, res, s), splitPieces(sp, s)
			if strings.Join(want, "\x00|") != strings.Join(got, "\x00|") {
				t.Fatalf("pattern %.20q… text %q:\n got %q\nwant %q", patterns[len(patterns)-1], s, got, want)
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
	f.Add("ア・イ 123中文45 x²y\u200b\u0301z (a.Net")
	var sps []*Splitter
	var res [][]*regexp2.Regexp
	for _, p := range splitCases {
		sp, _ := NewSequenceSplitter(p)
		sps, res = append(sps, sp), append(res, compileAll(p))
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for k, sp := range sps {
			want, got := isolatedPieces(t, res[k], s), splitPieces(sp, s)
			if strings.Join(want, "\x00|") != strings.Join(got, "\x00|") {
				t.Fatalf("splitter %d text %q:\n got %q\nwant %q", k, s, got, want)
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
