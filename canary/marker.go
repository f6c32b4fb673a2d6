// Package canary is pure leak-detection text work: deriving each tenant's secret marker from the
// shared secret, the injection helpers that place it into prompt text, the prefix scanner and
// the folded-text (loose) detector that find markers in reply text as it streams, and the
// folding that the prompt-text fingerprints share. What a detection produces (incidents,
// quarantine flags) is state's; decoding replies into text is reply's; HTTP is the gateway's.
//
// It must never let a "KVG-" byte reach a client (the prefix is reserved: own markers are
// stripped, unknown ones redacted, foreign ones cut the reply before the marker), never let more
// than 7 consecutive characters of another tenant's marker through in any form a reader decodes
// (loose.go), never delay or alter text beyond that, and never make a network round trip:
// markers are derived locally from the shared secret.
package canary

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
)

// MarkerPrefix is reserved: no "KVG-" byte ever reaches a client.
const MarkerPrefix = "KVG-"

// MarkerChars is the number of base32 characters after MarkerPrefix (100 bits of HMAC).
const MarkerChars = 20

// MarkerLen is the byte length of a complete marker.
const MarkerLen = len(MarkerPrefix) + MarkerChars

// FragmentMin is the number of base32 characters after "KVG-" from which a partial marker is
// attributed to its owner (40 bits: a chance match among 10^6 live markers is ~1 in 10^6).
const FragmentMin = 8

const b32alphabet = "abcdefghijklmnopqrstuvwxyz234567"

var b32 = base32.NewEncoding(b32alphabet).WithPadding(base32.NoPadding)

// b32val maps a byte to its 5-bit value, or -1 if it is not a lowercase base32 character.
var b32val = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(b32alphabet); i++ {
		t[b32alphabet[i]] = int8(i)
	}
	return t
}()

// Marker returns "KVG-" + 20 lowercase base32 characters (RFC 4648 alphabet, no padding): the
// first 100 bits of HMAC-SHA256(secret, uint32-BE len(tenant) ‖ tenant ‖ epoch as 8 bytes BE).
// The length prefix makes (tenant, epoch) pairs unambiguous ("alice1"/2 vs "alice"/12).
func Marker(secret []byte, tenant string, epoch uint64) string {
	var out [MarkerLen]byte
	markerInto(&out, hmac.New(sha256.New, secret), tenant, epoch)
	return string(out[:])
}

// markerInto writes the marker into out reusing mac (reset here), so bulk derivation in Refresh
// does not allocate a new HMAC per marker.
func markerInto(out *[MarkerLen]byte, mac interface {
	Reset()
	Write([]byte) (int, error)
	Sum([]byte) []byte
}, tenant string, epoch uint64) {
	mac.Reset()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(tenant)))
	mac.Write(hdr[:])
	mac.Write([]byte(tenant))
	var ep [8]byte
	binary.BigEndian.PutUint64(ep[:], epoch)
	mac.Write(ep[:])
	var sum [sha256.Size]byte
	s := mac.Sum(sum[:0])
	// 13 bytes encode to 21 characters; the first 20 carry exactly the first 100 bits.
	var enc [21]byte
	b32.Encode(enc[:], s[:13])
	copy(out[:], MarkerPrefix)
	copy(out[len(MarkerPrefix):], enc[:MarkerChars])
}

// prefixKey packs the first FragmentMin base32 characters of c (which must be valid) into 40 bits.
func prefixKey(c []byte) uint64 {
	var k uint64
	for i := 0; i < FragmentMin; i++ {
		k = k<<5 | uint64(b32val[c[i]])
	}
	return k
}

// b32run returns how many leading bytes of b (at most max) are lowercase base32 characters.
func b32run(b []byte, max int) int {
	n := 0
	for n < len(b) && n < max && b32val[b[n]] >= 0 {
		n++
	}
	return n
}
