package fingerprint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
	"unsafe"

	"github.com/kvgate/kvgate/canary"
)

// Shingle and Window fix what is hashed and sampled; Guaranteed is the length of a shared run
// (folded characters) that always yields a common fingerprint.
const (
	Shingle    = 24
	Window     = 16 // a power of two (winnower masks indices)
	Guaranteed = Shingle + Window - 1
)

// MaxQuoted is the most folded characters of one run of another tenant's prompt text that a
// reading passes before it holds cutMatches distinct fingerprints of it. Winnowing keeps a
// fingerprint in every Window consecutive shingles of the prompt and the reply side hashes every
// shingle, so the cutMatches-th ends by folded character Shingle + cutMatches·Window − 1 of the
// run; the text that completes it is not passed (cut_matches 3: 70 characters).
func MaxQuoted(cutMatches int) int { return Shingle + cutMatches*Window - 2 }

// mersenne61 is the rolling hash's modulus: 2^61−1, prime, with a cheap reduction.
const mersenne61 = 1<<61 - 1

// Hasher holds the keys derived from the canary secret. It is immutable and safe for concurrent
// use.
type Hasher struct {
	base   uint64 // the rolling hash's base, secret, in [2, 2^61−2]
	powOut uint64 // base^Shingle: removes the character leaving the shingle
	k0, k1 uint64 // SipHash key
}

// NewHasher derives the fingerprint keys from secret (the canary secret) with HMAC-SHA256 under
// a label of their own, so fingerprints and markers never share a key.
func NewHasher(secret []byte) *Hasher {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("kvgate fingerprint v1"))
	sum := m.Sum(nil)
	h := &Hasher{
		base: binary.LittleEndian.Uint64(sum[0:8])%(mersenne61-3) + 2,
		k0:   binary.LittleEndian.Uint64(sum[8:16]),
		k1:   binary.LittleEndian.Uint64(sum[16:24]),
	}
	h.powOut = 1
	for i := 0; i < Shingle; i++ {
		h.powOut = mulMod(h.powOut, h.base)
	}
	return h
}

func mulMod(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	// a, b < 2^61: the product is < 2^122; fold the bits above 61 back (2^61 ≡ 1).
	r := (lo & mersenne61) + (lo>>61 | hi<<3)
	if r >= mersenne61 {
		r -= mersenne61
	}
	return r
}

func addMod(a, b uint64) uint64 {
	r := a + b
	if r >= mersenne61 {
		r -= mersenne61
	}
	return r
}

// roller is the streaming state of folding and the rolling hash: the last Shingle folded
// characters and their hash. Text is folded as the canary detector reads a marker
// (canary.FoldByte, canary.FoldUnit): case, compatibility forms and look-alikes folded, HTML
// references and \u escapes read, separators (white space, dashes, dots, zero-width and other
// format characters, combining marks) skipped; the prompt and the reply are read the same way,
// so a reply that disguises a prompt the ways a marker can be disguised still matches it.
// Pieces may end anywhere, even inside a UTF-8 sequence or an escape.
type roller struct {
	h     *Hasher
	ring  [Shingle]uint64
	n     int    // characters rolled in so far
	value uint64 // hash of the last min(n, Shingle) characters
	pend  []byte // an incomplete character or escape at the end of the last piece
	buf   []byte // pend joined to the start of the next piece
}

// maxPend bounds what a character or escape may need of the next piece (the longest HTML
// reference the folding reads is 34 bytes).
const maxPend = 64

// feed folds s and calls emit with the rolling hash and the end offset (in bytes of all text fed
// so far, before folding) of every complete shingle. final: no text follows (a partial escape at
// the end is read as the characters it is).
func (r *roller) feed(s string, offset int, final bool, emit func(v uint64, end int)) {
	if len(r.pend) > 0 {
		p, k := len(r.pend), min(len(s), maxPend)
		r.buf = append(append(r.buf[:0], r.pend...), s[:k]...)
		r.pend = r.pend[:0]
		i := 0
		for i < p {
			n, wait := r.unit(r.buf, i, final && k == len(s), offset-p, emit)
			if wait {
				if k == len(s) {
					r.pend = append(r.pend, r.buf[i:]...) // still incomplete: all of s waits too
					return
				}
				n, _ = r.unit(r.buf, i, true, offset-p, emit) // cannot wait with maxPend more bytes
			}
			i += n
		}
		s, offset = s[i-p:], offset+i-p
	}
	b := unsafe.Slice(unsafe.StringData(s), len(s)) // read only
	for i := 0; i < len(b); {
		if c := canary.FoldByte(b[i]); c != canary.FoldSlow {
			i++
			if c != canary.FoldSkip {
				r.roll(uint64(c)+1, offset+i, emit)
			}
			continue
		}
		n, wait := r.unit(b, i, final, offset, emit)
		if wait {
			r.pend = append(r.pend[:0], b[i:]...)
			return
		}
		i += n
	}
}

// unit folds the character or escape at b[i] (offset: where b begins in the text); wait: it
// continues past b's end.
func (r *roller) unit(b []byte, i int, final bool, offset int, emit func(uint64, int)) (int, bool) {
	if !final && b[i] >= utf8.RuneSelf && !utf8.FullRune(b[i:]) {
		return 0, true
	}
	reading, c, size, wait := canary.FoldUnit(b[i:], final)
	if wait {
		return 0, true
	}
	end := offset + i + size
	for j := 0; j < len(reading); j++ {
		r.roll(uint64(reading[j])+1, end, emit)
	}
	if c != 0 {
		r.roll(uint64(c)+1, end, emit)
	}
	return size, false
}

// roll takes in one folded character (its value: the character plus one).
func (r *roller) roll(v uint64, end int, emit func(uint64, int)) {
	slot := r.n % Shingle
	r.value = mulMod(r.value, r.h.base)
	if r.n >= Shingle {
		r.value = addMod(r.value, mersenne61-mulMod(r.ring[slot], r.h.powOut))
	}
	r.value = addMod(r.value, v)
	r.ring[slot] = v
	r.n++
	if r.n >= Shingle {
		emit(r.value, end)
	}
}

// final is a shingle's fingerprint: the keyed PRF of its rolling hash.
func (h *Hasher) final(v uint64) uint64 { return sipHash64(h.k0, h.k1, v) }

// Sample appends to dst the fingerprints winnowing keeps from text (duplicates removed only
// where consecutive windows keep the same position).
func (h *Hasher) Sample(dst []uint64, text string) []uint64 {
	w := newEdgeWinnower()
	r := roller{h: h}
	r.feed(text, 0, true, func(v uint64, _ int) {
		if keep, ok := w.push(v); ok {
			dst = append(dst, h.final(keep))
		}
	})
	w.tail(func(keep uint64) { dst = append(dst, h.final(keep)) })
	return dst
}

// winnower keeps the minimum of the last Window values (the rightmost on ties), reporting each
// newly kept one once.
type winnower struct {
	// a monotonic queue of (value, position), values increasing from the front; indices are
	// taken modulo Window (a power of two) by masking
	vals [Window]uint64
	pos  [Window]int
	head uint
	size uint
	n    int // values pushed
	last int // position of the last reported minimum
	// edges: also report the minimum of every window the text's start cuts short (and, with
	// tail, its end). A prompt's text may sit inside another tenant's longer prompt, whose
	// windows across the edges keep positions near them that the prompt's own full windows
	// need not: with the edges kept, every position that any text around this one keeps in it
	// is this prompt's own too, so a tenant's earlier prompt is never another's evidence.
	edges bool
}

const windowMask = Window - 1

func newWinnower() *winnower { return &winnower{last: -1} }

func newEdgeWinnower() *winnower { return &winnower{last: -1, edges: true} }

func (w *winnower) push(v uint64) (uint64, bool) {
	i := w.n
	w.n++
	// Drop from the front what leaves the window with v's arrival.
	if w.size > 0 && w.pos[w.head&windowMask] <= i-Window {
		w.head++
		w.size--
	}
	// Drop from the back every value not smaller than v: v is later and at most as large.
	for w.size > 0 && w.vals[(w.head+w.size-1)&windowMask] >= v {
		w.size--
	}
	b := (w.head + w.size) & windowMask
	w.vals[b], w.pos[b] = v, i
	w.size++
	if w.n < Window && !w.edges {
		return 0, false // the first window is not full yet
	}
	if p := w.pos[w.head&windowMask]; p != w.last {
		w.last = p
		return w.vals[w.head&windowMask], true
	}
	return 0, false
}

// tail reports, at the text's end, the minimum of every window its end cuts short (the
// suffixes of the last window): the queue holds exactly those, positions increasing.
func (w *winnower) tail(emit func(uint64)) {
	for k := uint(0); k < w.size; k++ {
		j := (w.head + k) & windowMask
		if w.pos[j] != w.last {
			w.last = w.pos[j]
			emit(w.vals[j])
		}
	}
}
