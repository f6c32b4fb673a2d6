package canary

import "math/bits"

// HoldMin is the run of consecutive characters of a live foreign marker (from any offset, in
// either direction, after folding) from which the folded detector withholds text: the first
// HoldMin−1 characters of a run reach the client, the rest never do (they are replaced by
// Redacted, or the reply is cut once the run is evidence). So at most HoldMin−1 = 7 consecutive
// characters of another tenant's marker ever reach a client.
const HoldMin = 8

// markerRec is one live marker in the order the window table refers to it.
type markerRec struct {
	body   [MarkerChars]byte // the 20 characters after "KVG-"
	tenant uint32
	epoch  uint64
}

// winTable is an open-addressed set of every HoldMin-character window of every live marker body,
// forwards and backwards, in classes (foldClass), 5 bits a character: a slot holds the window's
// 40 bits and, below them, 1 + the index of its marker in recs (24 bits, so at most 2^24−1 live
// markers). Storing both directions lets the detector probe once per character. Linear probing,
// at most half full; 0 is an empty slot. A million live markers take 26 million windows in 2^26
// slots (512 MB); 10^5 take 64 MB.
type winTable struct {
	slots []uint64
	shift uint // 64 − log2(len(slots))
}

const (
	winKeyBits = 5 * HoldMin
	winRecBits = 64 - winKeyBits
	winRecMax  = 1<<winRecBits - 1
	winKeyMask = 1<<winKeyBits - 1
)

func newWinTable(windows int) winTable {
	n := 1024
	for n < 2*windows {
		n <<= 1
	}
	return winTable{slots: make([]uint64, n), shift: uint(64 - bits.TrailingZeros(uint(n)))}
}

func (t *winTable) home(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> t.shift }

func (t *winTable) insert(key uint64, rec int) {
	v := key<<winRecBits | uint64(rec+1)
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		if t.slots[i] == 0 {
			t.slots[i] = v
			return
		}
	}
}

// has says whether any window has key (the first probe answers most misses).
func (t *winTable) has(key uint64) bool {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return false
		}
		if s>>winRecBits == key {
			return true
		}
	}
}

// each calls f with the index of every marker that has a window equal to key.
func (t *winTable) each(key uint64, f func(rec int)) {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return
		}
		if s>>winRecBits == key {
			f(int(s&winRecMax) - 1)
		}
	}
}

// classIdx is the 5-bit class of a marker character (b32alphabet byte): characters one glyph
// can be read as (i and l) share one.
var classIdx = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(b32alphabet); i++ {
		t[b32alphabet[i]] = b32val[foldClassOf[i]]
	}
	return t
}()

// windowsPerRec is how many keys a marker puts in the table: each window, both ways.
const windowsPerRec = 2 * (MarkerChars - HoldMin + 1)

// bodyWindowKey packs HoldMin characters of a marker body, in classes.
func bodyWindowKey(w []byte) uint64 {
	var k uint64
	for _, c := range w[:HoldMin] {
		k = k<<5 | uint64(classIdx[c])
	}
	return k
}

// buildWindows makes the table of recs' windows.
func buildWindows(recs []markerRec) winTable {
	t := newWinTable(len(recs) * windowsPerRec)
	for i := range recs {
		t.insertRec(&recs[i], i)
	}
	return t
}

func (t *winTable) insertRec(r *markerRec, i int) {
	for off := 0; off+HoldMin <= MarkerChars; off++ {
		t.insert(bodyWindowKey(r.body[off:off+HoldMin]), i)
		t.insert(reversedWindowKey(r.body[off:off+HoldMin]), i)
	}
}

// reversedWindowKey packs HoldMin characters of a marker body backwards: what text spelling
// them in reverse order packs to.
func reversedWindowKey(w []byte) uint64 {
	var k uint64
	for i := HoldMin - 1; i >= 0; i-- {
		k = k<<5 | uint64(classIdx[w[i]])
	}
	return k
}
