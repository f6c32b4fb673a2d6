package fingerprint

import "testing"

// The reference implementation's test vector for the 8-byte message 00 01 … 07 under the key
// 00 01 … 0f (vectors.h, SipHash-2-4, 64-bit output: 62 24 93 9a 79 f5 f5 93).
func TestSipHashReferenceVector(t *testing.T) {
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	const m = 0x0706050403020100
	if got, want := sipHash64(k0, k1, m), uint64(0x93f5f5799a932462); got != want {
		t.Fatalf("sipHash64 = %#x, want %#x", got, want)
	}
}
