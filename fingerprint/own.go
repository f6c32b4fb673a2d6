package fingerprint

import "math/bits"

// Own is every shingle of the requester's own prompt, as a blocked Bloom filter over the rolling
// hash: 3 bits in one 64-bit word per shingle (one memory access), 10 bits of filter per
// character, about 2% false positives, each of which can only make a foreign fingerprint look
// like the requester's own, never the reverse. Every shingle, not a sample: a reply quoting the
// requester's text at any offset must never count as a leak. It lives as long as its request:
// about 1.25 bytes per prompt byte.
type Own struct {
	bits []uint64
	mask uint64 // len(bits) − 1 (a power of two)
	// small holds the filter of a short prompt (up to ~200 characters): one allocation, not two.
	small [32]uint64
}

const ownBitsPerChar = 10

func newOwn(chars int) *Own {
	n := uint64(1)
	for n*64 < uint64(chars)*ownBitsPerChar {
		n <<= 1
	}
	o := &Own{mask: n - 1}
	if n <= uint64(len(o.small)) {
		o.bits = o.small[:n]
	} else {
		o.bits = make([]uint64, n)
	}
	return o
}

// probe is the word and the 3 bits of v.
func (o *Own) probe(v uint64) (uint64, uint64) {
	// v is a keyed hash modulo 2^61−1: mix it so every part reads fresh bits.
	hi, lo := bits.Mul64(v^0x9e3779b97f4a7c15, 0xff51afd7ed558ccd)
	x := hi ^ lo
	return (x >> 18) & o.mask, 1<<(x&63) | 1<<(x>>6&63) | 1<<(x>>12&63)
}

func (o *Own) add(v uint64) {
	w, b := o.probe(v)
	o.bits[w] |= b
}

func (o *Own) has(v uint64) bool {
	if o == nil {
		return false
	}
	w, b := o.probe(v)
	return o.bits[w]&b == b
}

// Bytes is the filter's size.
func (o *Own) Bytes() int { return len(o.bits) * 8 }

// Prompt reads one prompt's text once: the fingerprints to record (winnowed) and the filter of
// all its shingles for the reply's scanner.
func (h *Hasher) Prompt(text string) (fps []uint64, own *Own) {
	own = newOwn(len(text)) // bytes ≥ characters
	w := newEdgeWinnower()
	r := roller{h: h}
	fps = make([]uint64, 0, len(text)*2/(Window+1)+1)
	r.feed(text, 0, true, func(v uint64, _ int) {
		own.add(v)
		if keep, ok := w.push(v); ok {
			fps = append(fps, h.final(keep))
		}
	})
	w.tail(func(keep uint64) { fps = append(fps, h.final(keep)) })
	return fps, own
}
