package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/fingerprint/fptest"
)

var secret = []byte("test-secret-16-bytes")

// words is deterministic prose-like text of n words from seed (no two seeds share runs).
func words(seed uint64, n int) string { return fptest.Words(rand.New(rand.NewPCG(seed, 7)), n) }

// foldedPrefix is the shortest prefix of s (letters and spaces) holding n letters.
func foldedPrefix(s string, n int) string {
	for i := 0; i < len(s); i++ {
		if s[i] != ' ' {
			if n--; n == 0 {
				return s[:i+1]
			}
		}
	}
	return s
}

func newTestIndex(cfg Config) *Index { return NewIndex(NewHasher(secret), cfg) }

func keep(ix *Index, tenant string, backends []string, text string, at time.Time) *Own {
	fps, own := ix.Hasher().Prompt(text)
	ix.Record(tenant, backends, fps, at)
	return own
}

// Any run of Guaranteed folded characters shared by a prompt and a reply yields a common
// fingerprint, wherever it sits in either text (separators such as spaces are skipped, so the
// run is Guaranteed characters besides its spaces).
func TestSharedRunOfGuaranteedLengthAlwaysMatches(t *testing.T) {
	now := time.Unix(1e9, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		ix := newTestIndex(Config{CutMatches: 1})
		victim := words(uint64(trial)*2+100, 400)
		keep(ix, "victim", []string{"d0"}, victim, now)
		start := rng.IntN(len(victim) - 2*Guaranteed)
		run := foldedPrefix(victim[start:], Guaranteed) // words(): letters and spaces
		reply := words(uint64(trial)*2+101, 20) + "|" + run + "|" + words(uint64(trial)*2+102, 20)
		sc := ix.NewScanner("requester", []string{"p0", "d0"}, nil)
		if !sc.Feed(reply) {
			t.Fatalf("trial %d: a shared run of %d characters at offset %d gave no match", trial, Guaranteed, start)
		}
		if m := sc.Matches(); len(m) != 1 || m[0].Victim != "victim" || m[0].Length != Shingle || m[0].End <= 0 || m[0].End > len(reply) {
			t.Fatalf("trial %d: match %+v", trial, m)
		}
	}
}

// Case and white space do not hide a quote; text split anywhere (inside a UTF-8 sequence too)
// scans as it does whole.
func TestNormalisedAndSplitTextMatchesTheSame(t *testing.T) {
	now := time.Unix(1e9, 0)
	ix := newTestIndex(Config{CutMatches: 1000})
	victim := "Ünïcode Prose — " + words(5, 300)
	keep(ix, "a", []string{"u0"}, victim, now)
	disguised := strings.ToUpper(strings.ReplaceAll(victim, " ", " \n\t "))
	whole := ix.NewScanner("b", []string{"u0"}, nil)
	whole.Feed(disguised)
	if whole.Count() < 20 {
		t.Fatalf("a case- and space-changed quote gave %d matches", whole.Count())
	}
	for _, step := range []int{1, 2, 3, 7, 64} {
		sc := ix.NewScanner("b", []string{"u0"}, nil)
		for i := 0; i < len(disguised); i += step {
			sc.Feed(disguised[i:min(i+step, len(disguised))])
		}
		if sc.Count() != whole.Count() || fmt.Sprint(sc.Matches()) != fmt.Sprint(whole.Matches()) {
			t.Fatalf("pieces of %d bytes: %d matches %v, whole: %d %v", step, sc.Count(), sc.Matches(), whole.Count(), whole.Matches())
		}
	}
}

// What the requester sent itself, what several tenants sent (boilerplate), what went to other
// backends, and the requester's own earlier prompts are never evidence.
func TestWhatIsNotEvidence(t *testing.T) {
	now := time.Unix(1e9, 0)
	ix := newTestIndex(Config{CutMatches: 1, CommonTenants: 3})
	shared := words(10, 200)  // in the requester's prompt and a's
	licence := words(11, 200) // sent by a, b, c: boilerplate
	other := words(12, 200)   // sent by d to another backend
	earlier := words(13, 200) // sent by the requester earlier and by a
	aOnly := words(14, 200)   // sent by a alone
	keep(ix, "a", []string{"u0"}, shared+" "+earlier+" "+aOnly, now)
	for _, n := range []string{"a", "b", "c"} {
		keep(ix, n, []string{"u0"}, licence, now)
	}
	keep(ix, "d", []string{"u1"}, other, now)
	keep(ix, "z", []string{"u0"}, earlier, now)
	own := keep(ix, "z", []string{"u0"}, "my question: "+shared, now)
	for name, reply := range map[string]string{"own prompt": shared, "boilerplate": licence, "other backend": other, "earlier own prompt": earlier} {
		sc := ix.NewScanner("z", []string{"u0"}, own)
		if sc.Feed(reply) || sc.Count() != 0 {
			t.Errorf("%s: %d matches, leak %v", name, sc.Count(), sc.Leak())
		}
	}
	// a's text to a tenant that did not send it is evidence.
	sc := ix.NewScanner("y", []string{"u0"}, nil)
	if !sc.Feed(aOnly) || sc.Victim() != "a" {
		t.Fatalf("a's text in y's reply: leak %v victim %q", sc.Leak(), sc.Victim())
	}
}

// CutMatches distinct foreign fingerprints make the cut: a run quoted again and again counts
// once; fewer are a weak match.
func TestCutNeedsDistinctMatches(t *testing.T) {
	now := time.Unix(1e9, 0)
	victim := words(20, 500)
	piece := " " + victim[100:100+Guaranteed] + " "
	probe := newTestIndex(Config{CutMatches: 1000})
	keep(probe, "a", []string{"u0"}, victim, now)
	once := probe.NewScanner("b", []string{"u0"}, nil)
	once.Feed(piece)
	n := once.Count()
	if n == 0 {
		t.Fatal("a run of Guaranteed characters gave no match")
	}
	ix := newTestIndex(Config{CutMatches: n + 1})
	keep(ix, "a", []string{"u0"}, victim, now)
	sc := ix.NewScanner("b", []string{"u0"}, nil)
	for i := 0; i < 5; i++ {
		sc.Feed(piece)
	}
	if sc.Leak() || sc.Count() != n {
		t.Fatalf("one run repeated: count %d (once: %d), leak %v", sc.Count(), n, sc.Leak())
	}
	if !sc.Feed(" " + victim[300:400]) {
		t.Fatalf("100 more characters of a's prompt: count %d, no cut", sc.Count())
	}
}

// The cap holds and the oldest prompts go first; prompts past the TTL go too.
func TestIndexEvictsOldestFirstWithinItsCap(t *testing.T) {
	now := time.Unix(1e9, 0)
	ix := newTestIndex(Config{MaxBytes: 64 << 10, TTL: time.Hour, CutMatches: 1})
	texts := make([]string, 40)
	for i := range texts {
		texts[i] = words(uint64(100+i), 150)
		keep(ix, fmt.Sprintf("t%d", i), []string{"u0"}, texts[i], now.Add(time.Duration(i)*time.Second))
		if st := ix.Stats(); st.Bytes > 64<<10 {
			t.Fatalf("after %d prompts: %d bytes over the 64 KiB cap", i+1, st.Bytes)
		}
	}
	st := ix.Stats()
	if st.Evicted == 0 || st.Prompts+int(st.Evicted) != 40 {
		t.Fatalf("stats %+v", st)
	}
	found := func(i int) bool {
		sc := ix.NewScanner("reader", []string{"u0"}, nil)
		return sc.Feed(texts[i])
	}
	if found(0) || !found(39) {
		t.Fatalf("oldest still found %v, newest found %v", found(0), found(39))
	}
	oldestKept := int(st.Evicted)
	if !found(oldestKept) || found(oldestKept-1) {
		t.Fatalf("eviction not oldest first around prompt %d", oldestKept)
	}
	ix.Prune(now.Add(2 * time.Hour))
	if st := ix.Stats(); st.Prompts != 0 || st.Fingerprints != 0 || st.Bytes != 0 {
		t.Fatalf("past the TTL: %+v", st)
	}
}

// Different secrets give unrelated fingerprints: the same text never matches across keys.
func TestFingerprintsAreKeyed(t *testing.T) {
	text := words(30, 200)
	a, _ := NewHasher([]byte("secret-one-16-bytes!")).Prompt(text)
	b, _ := NewHasher([]byte("secret-two-16-bytes!")).Prompt(text)
	set := map[uint64]bool{}
	for _, f := range a {
		set[f] = true
	}
	for _, f := range b {
		if set[f] {
			t.Fatalf("fingerprint %x under both keys", f)
		}
	}
	if len(a) < 2*len(text)/(Window+1)/2 {
		t.Fatalf("%d fingerprints for %d characters: sampling too sparse", len(a), len(text))
	}
}

// The winnower reports exactly the minimum (rightmost on ties) of every full window, each
// position once, as a direct computation does; small values make ties common.
func TestWinnowerMatchesDirectMinima(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 200; trial++ {
		n := Window + rng.IntN(200)
		vals := make([]uint64, n)
		for i := range vals {
			vals[i] = uint64(rng.IntN(8))
		}
		var want []int
		for end := Window - 1; end < n; end++ {
			best := end - Window + 1
			for j := best; j <= end; j++ {
				if vals[j] <= vals[best] {
					best = j
				}
			}
			if len(want) == 0 || want[len(want)-1] != best {
				want = append(want, best)
			}
		}
		w := newWinnower()
		var got []int
		for _, v := range vals {
			if _, ok := w.push(v); ok {
				got = append(got, w.last)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("trial %d: kept positions %v, want %v", trial, got, want)
		}
	}
}

// A reply is hashed up to MaxScanBytes of its text: a long one costs bounded work and memory.
func TestScannerReadsAtMostMaxScanBytes(t *testing.T) {
	now := time.Unix(1e9, 0)
	ix := newTestIndex(Config{CutMatches: 1})
	victim := words(40, 300)
	keep(ix, "a", []string{"u0"}, victim, now)
	filler := strings.Repeat("x", MaxScanBytes-10)
	sc := ix.NewScanner("b", []string{"u0"}, nil)
	if sc.Feed(filler) || sc.Feed(" "+victim) {
		t.Fatal("text past MaxScanBytes was scanned")
	}
	sc = ix.NewScanner("b", []string{"u0"}, nil)
	if sc.Feed(filler[:1<<20]) || !sc.Feed(" "+victim) {
		t.Fatal("text within MaxScanBytes was not scanned")
	}
}
