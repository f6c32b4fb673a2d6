package tokenize

import (
	"math"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"

	"github.com/kvgate/kvgate/tokenize/bpe"
)

// LibraryKvgate is kvgate's own counting-only BPE (tokenize/bpe) over the vocabularies that
// github.com/tiktoken-go/tokenizer compiles in: the same counts, without producing tokens.
const LibraryKvgate = "kvgate"

var kvgateVocabs sync.Map // encoding name -> *onceVocab

type onceVocab struct {
	once  sync.Once
	enc   *Counter
	err   error
	codec tokenizer.Codec
}

// kvgateEncoder returns the shared counting-only encoder for encoding, built on first use from
// the vocabulary tiktoken-go compiles in (read back id by id; no file, no network).
func kvgateEncoder(encoding string) (Encoder, error) {
	v, _ := kvgateVocabs.LoadOrStore(encoding, &onceVocab{})
	ov := v.(*onceVocab)
	ov.once.Do(func() {
		codec, err := tokenizer.Get(tokenizer.Encoding(encoding))
		if err != nil {
			ov.err = err
			return
		}
		ov.codec = codec
		pattern := bpe.PatternCl100k
		if encoding == EncodingO200k {
			pattern = bpe.PatternO200k
		}
		split, err := bpe.NewSplitter(pattern)
		if err != nil {
			ov.err = err
			return
		}
		var tokens [][]byte
		for id, misses := 0, 0; misses < 1024; id++ {
			s, err := codec.Decode([]uint{uint(id)})
			if err != nil || s == "" {
				misses++
				tokens = append(tokens, nil)
				continue
			}
			misses = 0
			tokens = append(tokens, []byte(s))
		}
		for len(tokens) > 0 && tokens[len(tokens)-1] == nil {
			tokens = tokens[:len(tokens)-1]
		}
		vocab, err := bpe.FromRanks(tokens)
		if err != nil {
			ov.err = err
			return
		}
		ov.enc = &Counter{name: LibraryKvgate + "/" + encoding, split: split, vocab: vocab}
	})
	if ov.err != nil {
		return nil, ov.err
	}
	codec := ov.codec
	return &decodingCounter{Counter: ov.enc, codec: codec}, nil
}

// Counter counts with a pre-tokenizer and a BPE vocabulary, one pre-token at a time, stopping
// at the first pre-token that takes the count past the limit. Safe for concurrent use.
type Counter struct {
	name  string
	split *bpe.Splitter
	vocab *bpe.Vocab
	// special, when set, cuts text at added tokens first (Hugging Face tokenizers); each counts 1.
	special *SpecialMatcher
	// normalize, when set, rewrites text before it is split (Hugging Face normalizers).
	normalize func(string) string
}

// NewCounter returns a Counter (tokenize/hf builds Hugging Face tokenizers with it).
func NewCounter(name string, split *bpe.Splitter, vocab *bpe.Vocab, special *SpecialMatcher, normalize func(string) string) *Counter {
	return &Counter{name: name, split: split, vocab: vocab, special: special, normalize: normalize}
}

func (c *Counter) Name() string { return c.name }

var scratchPool = sync.Pool{New: func() any { return new(bpe.Scratch) }}

// Count implements Encoder. Unlike the library encoders it never cuts a pre-token: the count is
// the whole text's, exact, and linear in its length whatever the text.
func (c *Counter) Count(text string, stopAfter int) (int, bool) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	limit := stopAfter
	if stopAfter < 0 {
		limit = math.MaxInt
	}
	sc := scratchPool.Get().(*bpe.Scratch)
	defer scratchPool.Put(sc)
	n := 0
	for len(text) > 0 {
		seg := text
		special := ""
		if c.special != nil {
			var at int
			at, special = c.special.Find(text)
			seg = text[:at]
			text = text[at+len(special):]
		} else {
			text = ""
		}
		if c.normalize != nil {
			seg = c.normalize(seg)
		}
		for i := 0; i < len(seg); {
			j := c.split.Next(seg, i)
			n += c.vocab.Count(seg[i:j], sc)
			if n > limit {
				return n, false
			}
			i = j
		}
		if special != "" {
			if n++; n > limit {
				return n, false
			}
		}
	}
	return n, true
}

// decodingCounter adds Decode (Decoder) from the tiktoken-go codec of the same vocabulary.
type decodingCounter struct {
	*Counter
	codec tokenizer.Codec
}

func (d *decodingCounter) Decode(ids []int) (string, bool) {
	u := make([]uint, len(ids))
	for i, id := range ids {
		if id < 0 {
			return "", false
		}
		u[i] = uint(id)
	}
	s, err := d.codec.Decode(u)
	return s, err == nil
}

// SpecialMatcher finds added tokens (special tokens such as <|im_start|>) in text: Hugging Face
// tokenizers cut them out before anything else, leftmost first, longest at a position.
type SpecialMatcher struct {
	byFirst [256][]string // tokens by first byte, longest first
}

// NewSpecialMatcher returns a matcher of tokens (nil when there are none).
func NewSpecialMatcher(tokens []string) *SpecialMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &SpecialMatcher{}
	for _, t := range tokens {
		if t != "" {
			m.byFirst[t[0]] = append(m.byFirst[t[0]], t)
		}
	}
	for i := range m.byFirst {
		l := m.byFirst[i]
		for a := 1; a < len(l); a++ {
			for b := a; b > 0 && len(l[b]) > len(l[b-1]); b-- {
				l[b], l[b-1] = l[b-1], l[b]
			}
		}
	}
	return m
}

// Find returns the offset of the first added token in text and the token, or len(text) and "".
func (m *SpecialMatcher) Find(text string) (int, string) {
	for i := 0; i < len(text); i++ {
		cands := m.byFirst[text[i]]
		if cands == nil {
			// Skip ahead to the next byte that starts some token ('<' for every model we know).
			continue
		}
		for _, t := range cands {
			if strings.HasPrefix(text[i:], t) {
				return i, t
			}
		}
	}
	return len(text), ""
}
