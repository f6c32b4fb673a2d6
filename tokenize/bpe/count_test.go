package bpe

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"
)

// tiktokenTokens reads a vocabulary out of tiktoken-go, id by id.
func tiktokenTokens(t testing.TB, enc tokenizer.Encoding) [][]byte {
	codec, err := tokenizer.Get(enc)
	if err != nil {
		t.Fatal(err)
	}
	return ReadRanks(func(id uint) (string, error) { return codec.Decode([]uint{id}) })
}

type testVocab struct {
	v    *Vocab
	rank map[string]int
}

var (
	vocabOnce sync.Once
	vocabs    map[string]testVocab
)

func testVocabs(t testing.TB) map[string]testVocab {
	vocabOnce.Do(func() {
		vocabs = map[string]testVocab{}
		for _, enc := range []tokenizer.Encoding{tokenizer.Cl100kBase, tokenizer.O200kBase} {
			tokens := tiktokenTokens(t, enc)
			v, err := FromRanks(tokens)
			if err != nil {
				t.Fatal(err)
			}
			rank := make(map[string]int, len(tokens))
			for id, tok := range tokens {
				if tok != nil {
					rank[string(tok)] = id
				}
			}
			vocabs[string(enc)] = testVocab{v, rank}
		}
	})
	return vocabs
}

// refCount is tiktoken's byte_pair_encode written plainly: a pre-token that is a token is one;
// else start from single bytes and merge the adjacent pair whose concatenation has the lowest
// rank (leftmost on ties) until none is a token. Quadratic, obviously right.
func refCount(rank map[string]int, piece string) int {
	if _, ok := rank[piece]; ok || len(piece) <= 1 {
		return min(len(piece), 1)
	}
	parts := make([]string, len(piece))
	for i := 0; i < len(piece); i++ { // bytes, not runes
		parts[i] = piece[i : i+1]
	}
	for {
		best, at := -1, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := rank[parts[i]+parts[i+1]]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			return len(parts)
		}
		parts[at] += parts[at+1]
		parts = append(parts[:at+1], parts[at+2:]...)
	}
}

// adversarialPieces are single pre-tokens that make BPE work hard.
var adversarialPieces = []string{
	strings.Repeat("a", 1000), strings.Repeat(" ", 999), strings.Repeat("=", 700), strings.Repeat("ab", 400),
	strings.Repeat("!", 513), strings.Repeat("\n", 300), strings.Repeat("0", 3), strings.Repeat("é", 300),
	strings.Repeat("中", 200), strings.Repeat("😀", 100), "Pneumonoultramicroscopicsilicovolcanoconiosis",
	strings.Repeat("abc", 333), strings.Repeat("aab", 200), strings.Repeat("\t", 200), strings.Repeat("-", 777),
}

func TestCountEqualsReferenceMerge(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var sc Scratch
	for name, tv := range testVocabs(t) {
		pieces := append([]string(nil), adversarialPieces...)
		sp, _ := NewSplitter(PatternCl100k)
		for range 400 {
			s := randomText(r, 1+r.IntN(60))
			pieces = append(pieces, splitPieces(sp, s)...)
			pieces = append(pieces, s) // not a pre-token: BPE is exact on any bytes
		}
		for range 300 { // random bytes from a small alphabet: long pieces with many merges
			var b strings.Builder
			for range 1 + r.IntN(200) {
				b.WriteByte("ab ="[r.IntN(4)])
			}
			pieces = append(pieces, b.String())
		}
		for _, p := range pieces {
			if got, want := tv.v.Count(p, &sc), refCount(tv.rank, p); got != want {
				t.Fatalf("%s: Count(%q = % x) = %d, reference merge %d", name, p, p, got, want)
			}
		}
	}
}

// wideAlphabet is what countChunked meets: the characters of the vocabulary's multi-character
// tokens of three-byte characters (so that tokens span boundaries), random three-byte characters,
// and now and then a space, a letter, a two- or four-byte character or a stray byte.
func wideAlphabet(v *Vocab, r *rand.Rand) []string {
	var out []string
	for _, t := range v.tokens {
		if len(t) >= 6 && utf8.Valid(t) && utf8.RuneCount(t) == len(t)/3 {
			for _, c := range string(t) {
				out = append(out, string(c))
			}
		}
	}
	for range len(out)/4 + 100 {
		c := rune(0x800 + r.IntN(0x10000-0x800))
		if c < 0xD800 || c >= 0xE000 {
			out = append(out, string(c))
		}
	}
	return append(out, " ", "a", "é", "😀", "\x80", "\xe4\xb8", "，", "。", "ー", "・")
}

// TestChunkedCountEqualsReferenceMerge: long pre-tokens of three-byte characters, counted in parts
// cut at boundaries no token spans, count as the plain merge loop counts them whole.
func TestChunkedCountEqualsReferenceMerge(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	var sc Scratch
	for name, tv := range testVocabs(t) {
		alphabet := wideAlphabet(tv.v, r)
		for range 3000 {
			var b strings.Builder
			for range 3 + r.IntN(40) {
				if r.IntN(20) == 0 {
					b.WriteString(alphabet[len(alphabet)-10+r.IntN(10)])
				} else {
					b.WriteString(alphabet[r.IntN(len(alphabet))])
				}
			}
			p := b.String()
			if got, want := tv.v.Count(p, &sc), refCount(tv.rank, p); got != want {
				t.Fatalf("%s: Count(%q = % x) = %d, reference merge %d", name, p, p, got, want)
			}
		}
	}
}

// FuzzCountPiece: the backtracking count of any byte string equals the plain merge loop's.
func FuzzCountPiece(f *testing.F) {
	for _, p := range adversarialPieces {
		f.Add(p)
	}
	f.Add("hello world")
	f.Add("人工智能正在改变我们处理信息的方式")
	f.Add("東京の天気は明日も晴れるでしょう")
	vs := testVocabs(f)
	var sc Scratch
	f.Fuzz(func(t *testing.T, p string) {
		if len(p) > 2000 {
			return // the reference is quadratic
		}
		for name, tv := range vs {
			if got, want := tv.v.Count(p, &sc), refCount(tv.rank, p); got != want {
				t.Fatalf("%s: Count(%q = % x) = %d, reference merge %d", name, p, p, got, want)
			}
		}
	})
}

// FuzzChunkedCount: counting a piece in parts cut at boundaries no token spans equals
// backtracking over it whole (which FuzzCountPiece holds to the plain merge loop), on any bytes
// and any length: cheap enough for long CJK runs.
func FuzzChunkedCount(f *testing.F) {
	f.Add("人工智能正在改变我们处理信息的方式，缓存中的数据必须被安全地隔离")
	f.Add("東京の天気は明日も晴れるでしょう。オンライン・ショッピング")
	f.Add(" 中华人民共和国国务院\xe4\xb8")
	vs := testVocabs(f)
	var sc Scratch
	f.Fuzz(func(t *testing.T, p string) {
		for name, tv := range vs {
			if got, want := tv.v.countChunked(p, &sc), tv.v.backtrack(p, &sc); got != want {
				t.Fatalf("%s: countChunked(%q = % x) = %d, backtracking %d", name, p, p, got, want)
			}
		}
	})
}
