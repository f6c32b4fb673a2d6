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

// winSet holds every HoldMin-character window of a range of live marker bodies, in classes
// (foldClass), 5 bits a character, under its canonical key: the smaller of the window read
// forwards and backwards (canonKey). A run of text is probed once per character with the
// canonical key of its last HoldMin characters, which finds a marker spelled either way with half
// the entries of storing both directions.
//
// Two levels, so that a probe that misses (nearly all of them) costs one cache line:
//   - filter: a Bloom filter blocked to one 64-bit word per key (three bits set per window, ~10
//     bits per window): 13 MB at 10^6 live markers, a false pass about once in 40 probes;
//   - slots: the exact set, open-addressed with linear probing from the start of a bucket of 8
//     slots (one cache line), at most ~80 % full. A slot holds the window's 40 bits and, below
//     them, 1 + the index of its marker in the ring's recs (24 bits, so at most 2^24−1 live
//     markers); 0 is empty. 13 windows a marker: 10^6 live markers take ~130 MB.
type winSet struct {
	slots  []uint64
	nb     uint64 // buckets of slotsPerBucket; slots has nb+1 buckets (the last one catches overflow)
	filter []uint64
	fshift uint // 64 − log2(len(filter))
}

const (
	winKeyBits     = 5 * HoldMin
	winRecBits     = 64 - winKeyBits
	winRecMax      = 1<<winRecBits - 1
	winKeyMask     = 1<<winKeyBits - 1
	slotsPerBucket = 8
)

// windowsPerRec is how many keys a marker puts in a set: each window once (canonical).
const windowsPerRec = MarkerChars - HoldMin + 1

// mix spreads a window key over 64 bits (the finalizer of MurmurHash3).
func mix(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	return k
}

// filterMask is the word's three bits for a mixed key.
func filterMask(h uint64) uint64 {
	return 1<<(h&63) | 1<<(h>>6&63) | 1<<(h>>12&63)
}

func newWinSet(windows int) winSet {
	nb := uint64(windows*5/4/slotsPerBucket + 1) // ≤ 80 % full
	nf := 1
	for nf*64 < windows*10 {
		nf <<= 1
	}
	return winSet{
		slots:  make([]uint64, (nb+2)*slotsPerBucket),
		nb:     nb,
		filter: make([]uint64, nf),
		fshift: uint(64 - bits.TrailingZeros(uint(nf))),
	}
}

// home is the first slot probed for a mixed key.
func (t *winSet) home(h uint64) uint64 {
	b, _ := bits.Mul64(h, t.nb)
	return b * slotsPerBucket
}

func (t *winSet) insert(key uint64, rec int) {
	h := mix(key)
	t.filter[h>>t.fshift] |= filterMask(h)
	v := key<<winRecBits | uint64(rec+1)
	for i := t.home(h); ; i++ {
		if i == uint64(len(t.slots)) {
			// Past the spare bucket (never at ≤ 80 % load in practice): wrap.
			i = 0
		}
		if t.slots[i] == 0 {
			t.slots[i] = v
			return
		}
	}
}

// mayHave is the filter: false means no window has key.
func (t *winSet) mayHave(key uint64) bool {
	if len(t.filter) == 0 {
		return false
	}
	h := mix(key)
	m := filterMask(h)
	return t.filter[h>>t.fshift]&m == m
}

// each calls f with the index of every marker that has a window whose canonical key is key.
func (t *winSet) each(key uint64, f func(rec int)) {
	if len(t.slots) == 0 {
		return
	}
	for i := t.home(mix(key)); ; i++ {
		if i == uint64(len(t.slots)) {
			i = 0
		}
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
func canonKey(fwd, rev uint64) uint64 { return min(fwd, rev) }

// buildWinSet makes the set of the windows of recs[lo:hi] (indexes stay those of recs).
func buildWinSet(recs []markerRec, lo, hi int) winSet {
	t := newWinSet((hi - lo) * windowsPerRec)
	for i := lo; i < hi; i++ {
		t.insertRec(&recs[i], i)
	}
	return t
}

func (t *winSet) insertRec(r *markerRec, i int) {
	for off := 0; off+HoldMin <= MarkerChars; off++ {
		w := r.body[off : off+HoldMin]
		t.insert(canonKey(bodyWindowKey(w), reversedWindowKey(w)), i)
	}
}
