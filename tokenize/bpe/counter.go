package bpe

import (
	"math"
	"strings"
	"sync"
	"unicode/utf8"
)

// Counter counts with a pre-tokenizer and a BPE vocabulary, one pre-token at a time, stopping
// at the first pre-token that takes the count past the limit. Safe for concurrent use.
type Counter struct {
	name  string
	split *Splitter
	vocab *Vocab
	// special, when set, cuts text at added tokens first (Hugging Face tokenizers); each counts 1.
	special *SpecialMatcher
	// normalize, when set, rewrites text before it is split (Hugging Face normalizers).
	normalize func(string) string
	// scratch holds per-call working memory, the piece cache included (per Counter: cached
	// counts belong to this vocabulary).
	scratch sync.Pool
}

// NewCounter returns a Counter; special (added tokens) and normalize may be nil.
func NewCounter(name string, split *Splitter, vocab *Vocab, special *SpecialMatcher, normalize func(string) string) *Counter {
	return &Counter{name: name, split: split, vocab: vocab, special: special, normalize: normalize}
}

func (c *Counter) Name() string { return c.name }

// Count returns the token count of text, or, when that is over stopAfter (>= 0), some count
// over it and false: counting stops at the first pre-token past the limit. Invalid UTF-8 is
// counted as if each bad sequence were U+FFFD (what a JSON decoder hands an engine). Pre-tokens
// are never cut: the count is exact, and linear in the text's length whatever the text.
func (c *Counter) Count(text string, stopAfter int) (int, bool) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	limit := stopAfter
	if stopAfter < 0 {
		limit = math.MaxInt
	}
	sc, _ := c.scratch.Get().(*Scratch)
	if sc == nil {
		sc = new(Scratch)
	}
	defer c.scratch.Put(sc)
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
		for i, outer := 0, 0; i < len(seg); {
			if i == outer {
				outer = c.split.Outer(seg, i)
			}
			j := c.split.Fast(seg[:outer], i)
			if j == 0 {
				j = c.split.Next(seg[:outer], i)
			}
			n += c.vocab.cachedCount(seg, i, j, sc)
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

// Encode returns the tokens of text (their ids and texts, which concatenate to text made valid
// UTF-8): Count's tokens, for a simulator that must produce them. Added tokens get the ids given
// to NewSpecialMatcher.
func (c *Counter) Encode(text string) ([]uint32, []string) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	var sc Scratch
	var ids []uint32
	var pieces []string
	for len(text) > 0 {
		seg, special := text, ""
		if c.special != nil {
			var at int
			at, special = c.special.Find(text)
			seg, text = text[:at], text[at+len(special):]
		} else {
			text = ""
		}
		if c.normalize != nil {
			seg = c.normalize(seg)
		}
		for i, outer := 0, 0; i < len(seg); {
			if i == outer {
				outer = c.split.Outer(seg, i)
			}
			j := c.split.Next(seg[:outer], i)
			start := len(ids)
			ids = c.vocab.AppendTokens(ids, seg[i:j], &sc)
			at := i
			for _, id := range ids[start:] {
				n := len(c.vocab.tokens[id])
				pieces = append(pieces, seg[at:at+n])
				at += n
			}
			i = j
		}
		if special != "" {
			ids = append(ids, c.special.ids[special])
			pieces = append(pieces, special)
		}
	}
	return ids, pieces
}

// SpecialMatcher finds added tokens (special tokens such as <|im_start|>) in text: Hugging Face
// tokenizers cut them out before anything else, leftmost first, longest at a position.
type SpecialMatcher struct {
	byFirst [256][]string // tokens by first byte, longest first
	firsts  []byte        // the first bytes in use ('<' alone for every model we know)
	ids     map[string]uint32
}

// NewSpecialMatcher returns a matcher of tokens (content → id; nil when there are none).
func NewSpecialMatcher(tokens map[string]uint32) *SpecialMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &SpecialMatcher{ids: tokens}
	for t := range tokens {
		if t != "" {
			if m.byFirst[t[0]] == nil {
				m.firsts = append(m.firsts, t[0])
			}
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
		if len(m.firsts) == 1 {
			k := strings.IndexByte(text[i:], m.firsts[0])
			if k < 0 {
				break
			}
			i += k
		}
		for _, t := range m.byFirst[text[i]] {
			if strings.HasPrefix(text[i:], t) {
				return i, t
			}
		}
	}
	return len(text), ""
}
