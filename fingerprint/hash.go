package fingerprint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"unicode"
	"unicode/utf8"
)

// Shingle and Window fix what is hashed and sampled; Guaranteed is the length of a shared run
// (normalised characters) that always yields a common fingerprint.
const (
	Shingle    = 24
	Window     = 16 // a power of two (winnower masks indices)
	Guaranteed = Shingle + Window - 1
)

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

// fold is the normalisation of one rune: white space becomes ' ', letters their lower case.
func fold(r rune) rune {
	if r < utf8.RuneSelf {
		switch {
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		case r == ' ' || r == '\n' || r == '\t' || r == '\r' || r == '\v' || r == '\f':
			return ' '
		}
		return r
	}
	if unicode.IsSpace(r) {
		return ' '
	}
	return unicode.ToLower(r)
}

// roller is the streaming state of normalisation and the rolling hash: the last Shingle
// characters and their hash. Pieces may end anywhere, even inside a UTF-8 sequence.
type roller struct {
	h       *Hasher
	ring    [Shingle]uint64
	n       int    // characters rolled in so far
	value   uint64 // hash of the last min(n, Shingle) characters
	space   bool   // the last character rolled in was a space
	partial []byte // an incomplete UTF-8 sequence at the end of the last piece
}

// feed normalises s and calls emit with the rolling hash and the end offset (in bytes of all
// text fed so far, before normalisation) of every complete shingle.
func (r *roller) feed(s string, offset int, emit func(v uint64, end int)) {
	if len(r.partial) > 0 {
		need := 0
		for need < len(s) && len(r.partial)+need < utf8.UTFMax && !utf8.FullRune(append(r.partial, s[:need]...)) {
			need++
		}
		buf := append(r.partial, s[:need]...)
		r.partial = r.partial[:0]
		if utf8.FullRune(buf) {
			c, _ := utf8.DecodeRune(buf)
			r.roll(c, offset+need, emit)
			s, offset = s[need:], offset+need
		} else if need == len(s) {
			r.partial = append(r.partial, buf...)
			return
		}
	}
	for i := 0; i < len(s); {
		c, size := rune(s[i]), 1
		if c >= utf8.RuneSelf {
			if !utf8.FullRuneInString(s[i:]) {
				r.partial = append(r.partial[:0], s[i:]...)
				return
			}
			c, size = utf8.DecodeRuneInString(s[i:])
		}
		i += size
		r.roll(c, offset+i, emit)
	}
}

func (r *roller) roll(c rune, end int, emit func(uint64, int)) {
	c = fold(c)
	if c == ' ' {
		if r.space || r.n == 0 {
			return // a run of white space is one space; leading space is none
		}
		r.space = true
	} else {
		r.space = false
	}
	v := uint64(c) + 1
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
	w := newWinnower()
	r := roller{h: h}
	r.feed(text, 0, func(v uint64, _ int) {
		if keep, ok := w.push(v); ok {
			dst = append(dst, h.final(keep))
		}
	})
	if w.n > 0 && w.n < Window {
		// Text shorter than one window: its smallest shingle stands for it.
		dst = append(dst, h.final(w.min()))
	}
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
}

const windowMask = Window - 1

func newWinnower() *winnower { return &winnower{last: -1} }

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
	if w.n < Window {
		return 0, false // the first window is not full yet (a shorter text: see Sample)
	}
	if p := w.pos[w.head&windowMask]; p != w.last {
		w.last = p
		return w.vals[w.head&windowMask], true
	}
	return 0, false
}

// min is the smallest value pushed in the current window.
func (w *winnower) min() uint64 { return w.vals[w.head&windowMask] }
