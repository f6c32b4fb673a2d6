package fingerprint

import "math/bits"

// sipHash64 is SipHash-2-4 (Aumasson and Bernstein) of one 8-byte message m (little-endian),
// under the 128-bit key (k0, k1). It is the keyed 64-bit hash of a fingerprint: a PRF, so a
// stored fingerprint says nothing about its text to anyone without the key, and fingerprints
// chosen by a tenant cannot be aimed at another's. Written out for the one message size used (the
// standard library has no keyed 64-bit hash whose key can be derived; maphash seeds randomly).
func sipHash64(k0, k1, m uint64) uint64 {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13)
		v1 ^= v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16)
		v3 ^= v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21)
		v3 ^= v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17)
		v1 ^= v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	v3 ^= m
	round()
	round()
	v0 ^= m
	const last = uint64(8) << 56 // the message length in the final block, no tail bytes
	v3 ^= last
	round()
	round()
	v0 ^= last
	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}
