package canary

import "math/bits"

// HoldMin is the run of consecutive characters of a live foreign marker (from any offset, in
// either direction, after folding) from which the folded detector withholds text: the first
// HoldMin−1 characters of a run reach the client, the rest never do (they are replaced by
// Redacted, or the reply is cut once the run is evidence). So at most HoldMin−1 = 7 consecutive
// characters of another tenant's marker ever reach a client.
const HoldMin = 8

// markerRec is one live marker in the order the window sets refer to it.
type markerRec struct {
	body   [MarkerChars]byte // the 20 characters after "KVG-"
	tenant uint32
	epoch  uint64
}

// winSet holds every setLen-character window (setLen = HoldMin−1 = 7) of a range of live marker
// bodies, in classes (foldClass), 5 bits a character. A run of text is probed with its last 7
// characters at every other character (when the run's length is even): every run of HoldMin = 8
// characters holds a 7-character window that ends at an even length, so a probe that misses
// there rules out both 8-character windows that contain it, and a hit sends the next characters
// to the exact check (Loose.probe).
//
// Two levels, so that a probe that misses (nearly all of them) costs one cache line:
//   - filter: a Bloom filter blocked to one 64-bit word per key, holding each window read
//     forwards and backwards (so the fast path probes the run's last 7 characters as read, with
//     no backward key to keep): four bits set per reading, 12 to 24 bits per reading, 64 MB at
//     10^6 live markers, a false pass about once in 100 to 160 probes (measured on random keys)
//     (then the exact set answers);
//   - slots: the exact set, open-addressed with linear probing from the start of a bucket of 8
//     slots (one cache line), at most ~80 % full. A slot holds the window's 35 bits, its offset
//     in the marker body (4 bits) and 1 + the index of its marker in the ring's recs (25 bits, so
//     at most 2^25−1 live markers); 0 is empty. Each window is stored once, under its canonical
//     key: the smaller of its two readings (canonKey). 14 windows a marker: 10^6 live markers
//     take ~140 MB.
type winSet struct {
	slots  []uint64
	nb     uint64 // buckets of slotsPerBucket; slots has two spare buckets (overflow at the end)
	filter []uint64
	fmask  uint64 // len(filter) − 1 (a power of two)
}

const (
	setLen         = HoldMin - 1
	winKeyBits     = 5 * HoldMin // a run's key: its last HoldMin characters
	winKeyMask     = 1<<winKeyBits - 1
	setKeyBits     = 5 * setLen
	setKeyMask     = 1<<setKeyBits - 1
	setOffBits     = 4
	setRecBits     = 64 - setKeyBits - setOffBits
	setRecMax      = 1<<setRecBits - 1
	slotsPerBucket = 8
	hashMul        = 0x9E3779B97F4A7C15
)

// windowsPerRec is how many keys a marker puts in a set: each 7-character window once.
const windowsPerRec = MarkerChars - setLen + 1

// A hashed key (key·hashMul) picks its filter word by bits 36 and up (up to 2^28 words: 2^25
// markers at 24 bits per reading) and its bits by the 10 bits below (filterMasks): every bit
// from 26 up depends on all 35 bits of the key, and neither needs a shift by a variable count
// (one register less in the fast path).
const (
	filterWordShift = 36
	filterMaskShift = 26
)

// filterWord is the index of the filter word for a hashed key.
func (t *winSet) filterWord(h uint64) uint64 { return h >> filterWordShift & t.fmask }

// filterMask is the filter word's bits for a hashed key: one load.
func filterMask(h uint64) uint64 { return filterMasks[h>>filterMaskShift&1023] }

// filterMasks are 1024 patterns of four distinct bits of a word (drawn by a fixed generator; four,
// not three: a false pass (a call and a miss in the exact set) costs more than the bit).
var filterMasks = func() (t [1024]uint64) {
	x := uint64(0x243F6A8885A308D3)
	for i := range t {
		for bits.OnesCount64(t[i]) < 4 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			t[i] |= 1 << (x >> 58)
		}
	}
	return t
}()

func newWinSet(windows int) winSet {
	nb := uint64(windows*5/4/slotsPerBucket + 1) // ≤ 80 % full
	nf := 1
	for nf*64 < 2*windows*12 { // each window both ways, 12 bits each at least
		nf <<= 1
	}
	return winSet{
		slots:  make([]uint64, (nb+2)*slotsPerBucket),
		nb:     nb,
		filter: make([]uint64, nf),
		fmask:  uint64(nf - 1),
	}
}

// home is the first slot probed for a hashed key.
func (t *winSet) home(h uint64) uint64 {
	b, _ := bits.Mul64(h, t.nb)
	return b * slotsPerBucket
}

// insert adds a window read forwards (fwd) and backwards (rev): the filter takes both readings
// (the fast path probes the run's last 7 characters one way only), the exact set the canonical.
func (t *winSet) insert(fwd, rev uint64, rec, off int) {
	for _, k := range [2]uint64{fwd, rev} {
		h := k * hashMul
		t.filter[t.filterWord(h)] |= filterMask(h)
	}
	key := canonKey(fwd, rev)
	h := key * hashMul
	v := key<<(setRecBits+setOffBits) | uint64(off)<<setRecBits | uint64(rec+1)
	for i := t.home(h); ; i++ {
		if i == uint64(len(t.slots)) {
			i = 0 // past the spare buckets (not at ≤ 80 % load in practice): wrap
		}
		if t.slots[i] == 0 {
			t.slots[i] = v
			return
		}
	}
}

// mayHave is the filter: false means no window has key (read either way).
func (t *winSet) mayHave(key uint64) bool {
	h := key * hashMul
	m := filterMask(h)
	return len(t.filter) > 0 && t.filter[t.filterWord(h)]&m == m
}

// has says whether a window has key (the filter passed).
func (t *winSet) has(key uint64) bool {
	for i := t.home(key * hashMul); ; i++ {
		if i == uint64(len(t.slots)) {
			i = 0
		}
		s := t.slots[i]
		if s == 0 {
			return false
		}
		if s>>(setRecBits+setOffBits) == key {
			return true
		}
	}
}

// each calls f with the index of every marker that has a window whose canonical key is key, and
// the window's offset in its body.
func (t *winSet) each(key uint64, f func(rec, off int)) {
	if len(t.slots) == 0 {
		return
	}
	for i := t.home(key * hashMul); ; i++ {
		if i == uint64(len(t.slots)) {
			i = 0
		}
		s := t.slots[i]
		if s == 0 {
			return
		}
		if s>>(setRecBits+setOffBits) == key {
			f(int(s&setRecMax)-1, int(s>>setRecBits&(1<<setOffBits-1)))
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

// bodyWindowKey packs HoldMin characters of a marker body, in classes.
func bodyWindowKey(w []byte) uint64 {
	var k uint64
	for _, c := range w[:HoldMin] {
		k = k<<5 | uint64(classIdx[c])
	}
	return k
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

// canonKey is the key a window is stored under: the smaller of its two readings.
// Without a branch (which way is smaller is a coin toss on text: a branch would mispredict half
// the probes); keys are below 2^63.
func canonKey(fwd, rev uint64) uint64 {
	lt := uint64(int64(fwd-rev) >> 63) // all ones when fwd < rev
	return rev ^ (fwd^rev)&lt
}

// runSetKey is the canonical set key of the last 7 characters of a run whose last HoldMin
// characters are fk (newest in the low bits) and rk (the same backwards).
func runSetKey(fk, rk uint64) uint64 { return canonKey(fk&setKeyMask, rk>>5) }

// setKeyOf is the canonical set key of 7 characters of a marker body.
func setKeyOf(w []byte) uint64 { return canonKey(setKeysOf(w)) }

// setKeysOf packs 7 characters of a marker body read forwards and backwards.
func setKeysOf(w []byte) (fwd, rev uint64) {
	for i := 0; i < setLen; i++ {
		fwd = fwd<<5 | uint64(classIdx[w[i]])
		rev = rev<<5 | uint64(classIdx[w[setLen-1-i]])
	}
	return fwd, rev
}

// buildWinSet makes the set of the windows of recs[lo:hi] (indexes stay those of recs).
func buildWinSet(recs []markerRec, lo, hi int) winSet {
	t := newWinSet((hi - lo) * windowsPerRec)
	for i := lo; i < hi; i++ {
		for off := 0; off+setLen <= MarkerChars; off++ {
			f, r := setKeysOf(recs[i].body[off : off+setLen])
			t.insert(f, r, i, off)
		}
	}
	return t
}
