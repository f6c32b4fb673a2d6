package fingerprint

import "math/bits"

// Own is every shingle of the requester's own prompt, as a Bloom filter over the rolling hash
// (10 bits and 3 probes per character: about 1.7% false positives, each of which can only make a
// foreign fingerprint look like the requester's own, never the reverse). Every shingle, not a
// sample: a reply quoting the requester's text at any offset must never count as a leak. It lives
// as long as its request: about 1.25 bytes per prompt character.
type Own struct {
	bits []uint64
	mask uint64 // len(bits)*64 − 1 (a power of two)
}

const ownBitsPerChar = 10

func newOwn(chars int) *Own {
	n := uint64(64)
	for n < uint64(chars)*ownBitsPerChar {
		n <<= 1
	}
	return &Own{bits: make([]uint64, n/64), mask: n - 1}
}

func (o *Own) probes(v uint64) (a, b, c uint64) {
	// v is a keyed hash modulo 2^61−1: mix it so every probe reads fresh bits.
	hi, lo := bits.Mul64(v^0x9e3779b97f4a7c15, 0xff51afd7ed558ccd)
	x := hi ^ lo
	return x & o.mask, (x >> 21) & o.mask, (x>>42 ^ x<<7) & o.mask
}

func (o *Own) add(v uint64) {
	a, b, c := o.probes(v)
	o.bits[a/64] |= 1 << (a % 64)
	o.bits[b/64] |= 1 << (b % 64)
	o.bits[c/64] |= 1 << (c % 64)
}

func (o *Own) has(v uint64) bool {
	if o == nil {
		return false
	}
	a, b, c := o.probes(v)
	return o.bits[a/64]&(1<<(a%64)) != 0 && o.bits[b/64]&(1<<(b%64)) != 0 && o.bits[c/64]&(1<<(c%64)) != 0
}

// Bytes is the filter's size.
func (o *Own) Bytes() int { return len(o.bits) * 8 }

// Prompt reads one prompt's text once: the fingerprints to record (winnowed) and the filter of
// all its shingles for the reply's scanner.
func (h *Hasher) Prompt(text string) (fps []uint64, own *Own) {
	own = newOwn(len(text)) // bytes ≥ characters
	w := newWinnower()
	r := roller{h: h}
	fps = make([]uint64, 0, len(text)*2/(Window+1)+1)
	r.feed(text, 0, func(v uint64, _ int) {
		own.add(v)
		if keep, ok := w.push(v); ok {
			fps = append(fps, h.final(keep))
		}
	})
	if w.n > 0 && w.n < Window {
		fps = append(fps, h.final(w.vals[w.head]))
	}
	return fps, own
}
