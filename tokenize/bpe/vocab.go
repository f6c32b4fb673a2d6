// Package bpe counts byte-level BPE tokens without producing them: the counting core shared by
// kvgate's cl100k_base / o200k_base encoders and the Hugging Face tokenizers (tokenize/hf).
//
// A pre-token (see Splitter) that is itself a token counts 1 with one map lookup: that is most
// pre-tokens of ordinary text. Any other pre-token is encoded by backtracking over a trie of the
// vocabulary (the algorithm of GitHub's rust-gems `bpe` crate): take the longest token that
// matches, keep it if BPE could have put it next to the previous token (the "compatible pair"
// check, which unwinds both tokens' merge histories), else try the next shorter prefix token, else
// step back. Each byte position is retried a bounded number of times, so a 400 KB run of one
// character or of spaces (one pre-token) is linear, where the usual merge loop is quadratic or
// needs a heap. The result equals ordinary BPE (lowest rank first, leftmost on ties); the tests
// compare it with a straightforward merge loop and with tiktoken-go.
//
// Token ids are ranks: of the merges possible at a step, BPE applies the one that makes the
// smallest id, leftmost on ties (tiktoken's ranks; a Hugging Face merge list must be in that
// order, which FromMerges checks).
package bpe

import (
	"bytes"
	"encoding/binary"
	"fmt"
	mathbits "math/bits"
	"sort"
	"unicode/utf8"
)

// Vocab is a byte-level BPE vocabulary prepared for counting. Safe for concurrent use.
type Vocab struct {
	tokens [][]byte
	// whole maps a token's bytes to its id, for the pre-tokens that are one token.
	whole map[string]uint32
	// pairs maps two adjacent tokens to the token BPE merges them into.
	pairs map[uint64]uint32
	// pairFilter is a Bloom filter of pairs' keys: most pairs the compatible-pair check asks
	// about merge into nothing, and one or two bit tests answer that (never wrongly: a key in
	// pairs always passes) where a miss in the large map costs a hash probe. Nil while building.
	pairFilter []uint64
	pairShift  uint
	splitLeft  []uint32 // the two tokens BPE merged into each token (itself for single bytes)
	splitRight []uint32
	nextPrefix []int32 // the longest reachable token that is a strict prefix of each token, -1 none
	trie       trie
	maxLen     int // the longest token's length: a longer pre-token is never one token
	// wide is the table of the three-byte characters (U+0800 to U+FFFF, CJK among them) by code
	// point, for cutting long pre-tokens at proven boundaries (countChunked): the count of the
	// character alone (wideCount bits), whether a token that starts inside it may end past it
	// (wideStarts: bit k when a token starting at its byte k may) and, when one starting at its
	// first byte may, the trie node after its three bytes (from wideNodeShift up).
	wide []uint32
	// contNext[b&0x3f] is the set of bytes that follow the continuation byte b in some token:
	// whether a token starting at a character's last byte may reach into the next character.
	contNext [64][4]uint64
}

const (
	wideCount      = 0x03
	wideStartShift = 4
	wideStarts     = 0x7 << wideStartShift
	wideNodeShift  = 8
)

// noToken marks an id with no token (vocabularies may have gaps).
const noToken = ^uint32(0)

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// ReadRanks reads a vocabulary id by id through decode (a library that only decodes, like
// tiktoken-go): tokens[id] as FromRanks takes it, nil for an id that does not decode, ending
// after 1024 ids in a row that do not.
func ReadRanks(decode func(id uint) (string, error)) [][]byte {
	var tokens [][]byte
	for id, misses := uint(0), 0; misses < 1024; id++ {
		s, err := decode(id)
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
	return tokens
}

// FromRanks builds a vocabulary with tiktoken's semantics: tokens[id] is the token whose rank is
// id (nil for a gap), and any two adjacent tokens whose concatenation is a token merge, lowest
// rank first. Every single byte must be a token.
func FromRanks(tokens [][]byte) (*Vocab, error) {
	return build(tokens, nil, true)
}

// FromMerges builds a vocabulary with Hugging Face's BPE semantics: only the listed merges
// happen, a merge's priority being the id of the token it makes (merge lists converted from
// tiktoken list every split of a token, in rank order; the order is checked). wholeWord
// is Hugging Face's ignore_merges: a pre-token that is a token counts 1 even when merges could
// not reach it.
func FromMerges(tokens [][]byte, merges [][2]uint32, wholeWord bool) (*Vocab, error) {
	index := make(map[string]uint32, len(tokens))
	for id, t := range tokens {
		if t != nil {
			index[string(t)] = uint32(id)
		}
	}
	pairs := make(map[uint64]uint32, len(merges))
	var lastMade uint32
	for i, m := range merges {
		a, b := m[0], m[1]
		if int(a) >= len(tokens) || int(b) >= len(tokens) || tokens[a] == nil || tokens[b] == nil {
			return nil, fmt.Errorf("bpe: merge %d names a token that is not in the vocabulary", i)
		}
		joined := string(tokens[a]) + string(tokens[b])
		id, ok := index[joined]
		if !ok {
			return nil, fmt.Errorf("bpe: merge %d (%q + %q) makes %q, which is not in the vocabulary", i, tokens[a], tokens[b], joined)
		}
		// Counting ranks merges by the id of the token they make: right when the merge list is
		// in that order (as lists made from tiktoken ranks are), wrong otherwise.
		if id < lastMade {
			return nil, fmt.Errorf("bpe: merge %d makes token %d after a merge made token %d: merges not in token order are unsupported", i, id, lastMade)
		}
		lastMade = id
		if _, dup := pairs[pairKey(a, b)]; !dup {
			pairs[pairKey(a, b)] = id
		}
	}
	return build(tokens, pairs, wholeWord)
}

func build(tokens [][]byte, pairs map[uint64]uint32, wholeAll bool) (*Vocab, error) {
	v := &Vocab{tokens: tokens, whole: make(map[string]uint32, len(tokens))}
	for id, t := range tokens {
		if t == nil {
			continue
		}
		if len(t) == 0 {
			return nil, fmt.Errorf("bpe: token %d is empty", id)
		}
		if prev, dup := v.whole[string(t)]; dup {
			return nil, fmt.Errorf("bpe: tokens %d and %d are both %q", prev, id, t)
		}
		v.whole[string(t)] = uint32(id)
		v.maxLen = max(v.maxLen, len(t))
	}
	for b := range 256 {
		if _, ok := v.whole[string([]byte{byte(b)})]; !ok {
			return nil, fmt.Errorf("bpe: byte 0x%02x is not a token (not a byte-level vocabulary)", b)
		}
	}
	explicit := pairs != nil
	if !explicit {
		pairs = make(map[uint64]uint32, len(tokens))
	}
	v.pairs = pairs
	n := len(tokens)
	v.splitLeft, v.splitRight = make([]uint32, n), make([]uint32, n)
	reachable := make([]bool, n)
	// Every token's canonical split, in rank order: the longest prefix token (of lower rank,
	// itself reachable) whose rest is a token, and which BPE could leave next to that rest.
	full := newTrie(tokens, nil)
	var prefixes []uint32
	for id, t := range tokens {
		v.splitLeft[id], v.splitRight[id] = noToken, noToken
		if t == nil {
			continue
		}
		if len(t) == 1 {
			v.splitLeft[id], v.splitRight[id] = uint32(id), uint32(id)
			reachable[id] = true
			continue
		}
		prefixes = full.prefixTokens(t, prefixes[:0])
		for k := len(prefixes) - 1; k >= 0; k-- {
			left := prefixes[k]
			if int(left) >= id || !reachable[left] || len(tokens[left]) == len(t) {
				continue
			}
			right, ok := v.whole[string(t[len(tokens[left]):])]
			if !ok || int(right) >= id || !reachable[right] {
				continue
			}
			if explicit {
				if made, ok := pairs[pairKey(left, right)]; !ok || made != uint32(id) {
					continue
				}
			}
			// Only merges made before this token count (all of them are listed already when
			// the merges were given).
			if !v.validPairBelow(left, right, uint32(id)) {
				continue
			}
			v.splitLeft[id], v.splitRight[id] = left, right
			if !explicit {
				pairs[pairKey(left, right)] = uint32(id)
			}
			reachable[id] = true
			break
		}
	}
	// Tokens that merges cannot make are never inside a longer pre-token's encoding; they count
	// only as a whole pre-token, and only where the semantics say so (tiktoken, ignore_merges).
	for id, t := range tokens {
		if t != nil && !reachable[id] && !wholeAll {
			delete(v.whole, string(t))
		}
	}
	v.buildPairFilter()
	v.trie = newTrie(tokens, reachable)
	v.nextPrefix = make([]int32, n)
	for id, t := range tokens {
		v.nextPrefix[id] = -1
		if t == nil || !reachable[id] {
			continue
		}
		prefixes = v.trie.prefixTokens(t[:len(t)-1], prefixes[:0])
		if len(prefixes) > 0 {
			v.nextPrefix[id] = int32(prefixes[len(prefixes)-1])
		}
	}
	v.buildWide()
	return v, nil
}

// buildWide fills the table of three-byte characters (see Vocab.wide).
func (v *Vocab) buildWide() {
	v.wide = make([]uint32, 1<<16)
	var sc Scratch
	var buf [3]byte
	for r := rune(0x800); r < 1<<16; r++ {
		if r >= 0xD800 && r < 0xE000 {
			continue // surrogates are not characters; valid UTF-8 never holds them
		}
		utf8.EncodeRune(buf[:], r)
		c := string(buf[:])
		e := uint32(v.backtrack(c, &sc)) // 1 to 3: merges only, as inside a longer pre-token
		for k := range 3 {
			if node, ok := v.trie.walk(c[k:]); ok && v.trie.nkids[node] > 0 {
				e |= 1 << (wideStartShift + k)
				if k == 0 {
					if node >= 1<<(32-wideNodeShift) {
						panic("bpe: trie too large for the character table")
					}
					e |= node << wideNodeShift
				}
			}
		}
		v.wide[r] = e
	}
	for b := 0x80; b < 0xC0; b++ {
		node, _ := v.trie.child(0, byte(b)) // every byte is a token
		for k := range uint32(v.trie.nkids[node]) {
			l := v.trie.label[v.trie.first[node]+k]
			v.contNext[b&0x3f][l>>6] |= 1 << (l & 63)
		}
	}
}

// Len is the number of ids (the largest id + 1).
func (v *Vocab) Len() int { return len(v.tokens) }

// Token returns the bytes of id (nil when there is none).
func (v *Vocab) Token(id int) []byte {
	if id < 0 || id >= len(v.tokens) {
		return nil
	}
	return v.tokens[id]
}

// validPair reports whether BPE can leave token1 directly before token2: no merge across their
// boundary would happen before both are complete (rust-gems bpe's is_valid_token_pair).
func (v *Vocab) validPair(token1, token2 uint32) bool {
	return v.validPairBelow(token1, token2, ^uint32(0))
}

// buildPairFilter sizes the filter at 16 bits or more per pair, two bits per key: about 1.4%
// of the keys not in pairs still go to the map.
func (v *Vocab) buildPairFilter() {
	bits := uint(1 << 10)
	for bits < 16*uint(len(v.pairs)) {
		bits <<= 1
	}
	v.pairShift = 64 - uint(mathbits.TrailingZeros(bits)) // bits is a power of two
	filter := make([]uint64, bits/64)
	for key := range v.pairs {
		a, b := v.pairFilterBits(key)
		filter[a>>6] |= 1 << (a & 63)
		filter[b>>6] |= 1 << (b & 63)
	}
	v.pairFilter = filter
}

// pairFilterBits are the two filter bits of key, from two independent multiplicative hashes.
func (v *Vocab) pairFilterBits(key uint64) (uint64, uint64) {
	return (key * 0x9E3779B97F4A7C15) >> v.pairShift, ((key ^ key>>29) * 0xC2B2AE3D27D4EB4F) >> v.pairShift
}

// merged returns the token BPE merges token1 and token2 into, if any.
func (v *Vocab) merged(token1, token2 uint32) (uint32, bool) {
	key := pairKey(token1, token2)
	if v.pairFilter != nil {
		a, b := v.pairFilterBits(key)
		if v.pairFilter[a>>6]&(1<<(a&63)) == 0 || v.pairFilter[b>>6]&(1<<(b&63)) == 0 {
			return 0, false
		}
	}
	combined, ok := v.pairs[key]
	return combined, ok
}

// validPairBelow is validPair considering only merges that make tokens below limit.
func (v *Vocab) validPairBelow(token1, token2, limit uint32) bool {
	for {
		if combined, ok := v.merged(token1, token2); ok && combined < limit {
			return false
		}
		if token1 > token2 {
			limit = token1
			token1 = v.splitRight[token1]
			if token1 == limit {
				limit = token2 + 1
				token2 = v.splitLeft[token2]
				if token2+1 == limit {
					return true
				}
			}
		} else {
			limit = token2 + 1
			token2 = v.splitLeft[token2]
			if token2+1 == limit {
				limit = token1
				token1 = v.splitRight[token1]
				if token1 == limit {
					return true
				}
			}
		}
	}
}

// Scratch is the per-call working memory of Count (reused across pre-tokens, never per token).
// The zero value is ready; it is not safe for concurrent use.
type Scratch struct {
	stack []uint32
	bits  []uint64
	cache *pieceCache
}

// pieceCache remembers the counts of short pre-tokens: prose repeats its words, and a hit in this
// small table (L2-resident, no pointers, so it never keeps a text alive) saves a lookup in the
// vocabulary's large map. Direct-mapped; a collision just replaces the entry.
type pieceCache [1 << 12]cacheEntry

type cacheEntry struct {
	a, b uint64 // the piece's bytes, zero-padded to 16
	meta uint32 // len<<8 | count; 0: empty
}

// cachedCount is Count of s[i:j] through the scratch's piece cache (pieces of 2 to 16 bytes).
func (v *Vocab) cachedCount(s string, i, j int, sc *Scratch) int {
	piece := s[i:j]
	n := j - i
	if n <= 1 || n > 16 {
		return v.Count(piece, sc)
	}
	// The piece's bytes, zero-padded to 16: read in place, masked, when the text goes on for 16
	// bytes (almost always), else copied.
	var a, b uint64
	if i+16 <= len(s) {
		a, b = le64(s[i:]), le64(s[i+8:])
		if n < 8 {
			a, b = a&(1<<(8*n)-1), 0
		} else {
			b &= 1<<(8*(n-8)) - 1 // all ones for n == 16: the shift gives 0
		}
	} else {
		var buf [16]byte
		copy(buf[:], piece)
		a, b = binary.LittleEndian.Uint64(buf[:8]), binary.LittleEndian.Uint64(buf[8:])
	}
	h := (a*0x9E3779B97F4A7C15 ^ b*0xC2B2AE3D27D4EB4F ^ uint64(n)) >> (64 - 12)
	if sc.cache == nil {
		sc.cache = new(pieceCache)
	}
	e := &sc.cache[h]
	if e.a == a && e.b == b && e.meta>>8 == uint32(n) {
		return int(e.meta & 0xff)
	}
	c := v.Count(piece, sc)
	if c < 256 {
		*e = cacheEntry{a: a, b: b, meta: uint32(n)<<8 | uint32(c)}
	}
	return c
}

// le64 reads s[:8] little-endian (one load: the compiler combines the byte reads).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// Count returns the number of tokens BPE encodes piece (one pre-token) into.
func (v *Vocab) Count(piece string, sc *Scratch) int {
	if len(piece) <= 1 {
		return len(piece)
	}
	if len(piece) <= v.maxLen {
		if _, ok := v.whole[piece]; ok {
			return 1
		}
	}
	if len(piece) >= 9 && (isWideLead(piece[0]) || isWideLead(piece[1])) {
		return v.countChunked(piece, sc)
	}
	return v.backtrack(piece, sc)
}

func isWideLead(c byte) bool { return c&0xF0 == 0xE0 }

// countChunked counts a pre-token of (mostly) three-byte characters, such as a run of Han
// characters, which cl100k_base-style patterns keep whole however long it is. It cuts the piece at
// every character boundary that no reachable token spans, and adds up the parts' counts: at such a
// boundary BPE never merges across (every merge makes a reachable token spanning its two halves),
// and the merges on each side, taken alone, are exactly the ones BPE makes there (the lowest rank
// overall, when on the left, is the lowest on the left, and likewise on the right; ties go
// leftmost on both readings), so the encoding of the piece is the encodings of the parts, end to
// end. A character alone comes from the table; a longer part is backtracked as usual. Whether a
// token spans a boundary is known by walking the trie only from characters the table marks as
// starters (a token starting in them may end past them).
//
// The whole-piece rule (a pre-token that is a token counts 1) is Count's; parts follow merges only.
// piece must be valid UTF-8.
func (v *Vocab) countChunked(piece string, sc *Scratch) int {
	n, start, reach := 0, 0, 0
	for i := 0; i < len(piece); {
		if i > start && reach <= i {
			n += v.countPart(piece[start:i], sc)
			start = i
		}
		if e := v.wideEntry(piece, i); e != 0 {
			if next := i + 3; next < len(piece) && e&wideStarts != 0 {
				// Tokens starting at the first byte go on from the character's node; at the
				// last byte, only if the next byte can follow it; at the middle byte (rare), walk.
				if e&(1<<wideStartShift) != 0 {
					reach = max(reach, v.trie.furthest(e>>wideNodeShift, piece, next))
				}
				if e&(2<<wideStartShift) != 0 {
					if t := v.trie.longest(piece, i+1); t >= 0 {
						reach = max(reach, i+1+len(v.tokens[t]))
					}
				}
				if b, nb := piece[i+2], piece[next]; e&(4<<wideStartShift) != 0 && v.contNext[b&0x3f][nb>>6]&(1<<(nb&63)) != 0 {
					node, _ := v.trie.child(0, b)
					reach = max(reach, v.trie.furthest(node, piece, next))
				}
			}
			i += 3
			continue
		}
		size := 1
		if piece[i] >= utf8.RuneSelf {
			_, size = utf8.DecodeRuneInString(piece[i:])
		}
		reach = max(reach, v.reachFrom(piece, i, size))
		i += size
	}
	return n + v.countPart(piece[start:], sc)
}

// reachFrom is the furthest end of a reachable token that starts inside piece[i:i+size].
func (v *Vocab) reachFrom(piece string, i, size int) int {
	reach := i + size
	for k := i; k < i+size; k++ {
		if t := v.trie.longest(piece, k); t >= 0 {
			reach = max(reach, k+len(v.tokens[t]))
		}
	}
	return reach
}

// countPart counts one part of countChunked's piece by merges alone.
func (v *Vocab) countPart(part string, sc *Scratch) int {
	if len(part) == 3 {
		if e := v.wideEntry(part, 0); e != 0 {
			return int(e & wideCount)
		}
	}
	return v.backtrack(part, sc)
}

// wideEntry is the table entry of the three-byte character at s[i], 0 when there is none there
// (Vocab.Count takes any bytes: a bad sequence is counted byte by byte, on the general path).
func (v *Vocab) wideEntry(s string, i int) uint32 {
	if i+2 >= len(s) || !isWideLead(s[i]) || s[i+1]&0xC0 != 0x80 || s[i+2]&0xC0 != 0x80 {
		return 0
	}
	return v.wide[rune(s[i]&0x0F)<<12|rune(s[i+1]&0x3F)<<6|rune(s[i+2]&0x3F)] // 0 below U+0800 and for surrogates
}

// AppendTokens appends the ids BPE encodes piece (one pre-token) into (the simulator needs the
// tokens themselves; counting never builds them).
func (v *Vocab) AppendTokens(ids []uint32, piece string, sc *Scratch) []uint32 {
	if piece == "" {
		return ids
	}
	if id, ok := v.whole[piece]; ok {
		return append(ids, id)
	}
	v.backtrack(piece, sc)
	return append(ids, sc.stack...)
}

func (v *Vocab) backtrack(piece string, sc *Scratch) int {
	n := len(piece)
	words := n/64 + 1
	if cap(sc.bits) < words {
		sc.bits = make([]uint64, words)
	}
	bits := sc.bits[:words]
	for i := range bits {
		bits[i] = ^uint64(0) // every position may still end a token
	}
	stack := sc.stack[:0]
	pos := 0
	next := v.trie.longest(piece, 0)
	for next >= 0 {
		token := uint32(next)
		for {
			end := pos + len(v.tokens[token])
			if bits[end>>6]&(1<<(end&63)) != 0 && (len(stack) == 0 || v.validPair(stack[len(stack)-1], token)) {
				stack = append(stack, token)
				pos = end
				next = -1
				if pos < n {
					next = v.trie.longest(piece, pos)
				}
				break
			}
			if p := v.nextPrefix[token]; p >= 0 {
				token = uint32(p)
				continue
			}
			// No token starting here fits: this position cannot start a token; step back.
			bits[pos>>6] &^= 1 << (pos & 63)
			if len(stack) == 0 {
				sc.stack = stack
				return n // unreachable for a byte-level vocabulary; the byte count is sound
			}
			last := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			pos -= len(v.tokens[last])
			next = int32(last)
			break
		}
	}
	sc.stack = stack
	return len(stack)
}

// trie is a byte trie of the reachable tokens, children of a node stored contiguously and
// sorted by byte, so a walk touches a few cache lines and never hashes.
type trie struct {
	tok   []int32  // token ending at the node, -1 none
	first []uint32 // index of the node's first child
	nkids []uint16
	label []byte // the byte leading into the node
}

// newTrie builds the trie of tokens (only those with keep[id], or all when keep is nil).
func newTrie(tokens [][]byte, keep []bool) trie {
	var ids []uint32
	for id, t := range tokens {
		if t != nil && (keep == nil || keep[id]) {
			ids = append(ids, uint32(id))
		}
	}
	sort.Slice(ids, func(i, j int) bool { return bytes.Compare(tokens[ids[i]], tokens[ids[j]]) < 0 })
	t := trie{tok: []int32{-1}, first: []uint32{0}, nkids: []uint16{0}, label: []byte{0}}
	t.fill(tokens, ids, 0, 0)
	return t
}

// fill creates the children of node for ids (sorted, sharing their first depth bytes), all
// siblings before any grandchild so that siblings are contiguous.
func (t *trie) fill(tokens [][]byte, ids []uint32, depth int, node uint32) {
	if len(ids) > 0 && len(tokens[ids[0]]) == depth {
		t.tok[node] = int32(ids[0])
		ids = ids[1:]
	}
	type group struct{ lo, hi int }
	var groups []group
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && tokens[ids[j]][depth] == tokens[ids[i]][depth] {
			j++
		}
		groups = append(groups, group{i, j})
		i = j
	}
	t.first[node] = uint32(len(t.tok))
	t.nkids[node] = uint16(len(groups))
	for _, g := range groups {
		t.tok = append(t.tok, -1)
		t.first = append(t.first, 0)
		t.nkids = append(t.nkids, 0)
		t.label = append(t.label, tokens[ids[g.lo]][depth])
	}
	for k, g := range groups {
		t.fill(tokens, ids[g.lo:g.hi], depth+1, t.first[node]+uint32(k))
	}
}

func (t *trie) child(node uint32, b byte) (uint32, bool) {
	lo, n := t.first[node], uint32(t.nkids[node])
	if n == 256 {
		return lo + uint32(b), true
	}
	hi := lo + n
	for lo < hi {
		mid := (lo + hi) / 2
		switch l := t.label[mid]; {
		case l == b:
			return mid, true
		case l < b:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return 0, false
}

// longest returns the longest token that s[pos:] starts with, -1 none.
func (t *trie) longest(s string, pos int) int32 {
	best := int32(-1)
	node := uint32(0)
	for i := pos; i < len(s); i++ {
		c, ok := t.child(node, s[i])
		if !ok {
			break
		}
		node = c
		if tok := t.tok[node]; tok >= 0 {
			best = tok
		}
	}
	return best
}

// walk returns the node that s leads to from the root, if any.
func (t *trie) walk(s string) (uint32, bool) {
	node := uint32(0)
	for i := 0; i < len(s); i++ {
		c, ok := t.child(node, s[i])
		if !ok {
			return 0, false
		}
		node = c
	}
	return node, true
}

// furthest returns the end of the longest token that goes on from node over s[i:] (counting from
// the start of s), 0 when none does.
func (t *trie) furthest(node uint32, s string, i int) int {
	best := 0
	for ; i < len(s); i++ {
		c, ok := t.child(node, s[i])
		if !ok {
			break
		}
		node = c
		if t.tok[node] >= 0 {
			best = i + 1
		}
	}
	return best
}

// prefixTokens appends the tokens that are prefixes of b (itself included), shortest first.
func (t *trie) prefixTokens(b []byte, out []uint32) []uint32 {
	node := uint32(0)
	for _, c := range b {
		next, ok := t.child(node, c)
		if !ok {
			break
		}
		node = next
		if tok := t.tok[node]; tok >= 0 {
			out = append(out, uint32(tok))
		}
	}
	return out
}
