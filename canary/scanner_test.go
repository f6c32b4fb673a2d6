package canary

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// world is a keyring plus an independent list of every live marker, derived from the written
// definition (Marker and the window arithmetic), for the reference scanner below.
type world struct {
	secret []byte
	k      *Keyring
	now    time.Time
	live   map[string]Owner // complete marker → owner
	cur    map[string]string
}

func newWorld(t testing.TB, tenants ...string) *world {
	t.Helper()
	w := &world{secret: []byte("property secret"), now: time.Now(), live: map[string]Owner{}, cur: map[string]string{}}
	w.k = NewKeyring(w.secret, time.Hour, 6*time.Hour, tenants)
	lo := w.k.Epoch(w.now.Add(-6 * time.Hour))
	hi := w.k.Epoch(w.now) + 1
	for _, tn := range tenants {
		for e := lo; e <= hi; e++ {
			w.live[Marker(w.secret, tn, e)] = Owner{tn, e}
		}
		w.cur[tn], _ = w.k.Current(tn, w.now)
	}
	return w
}

// reference is the scanner's semantics written as plainly as possible on a whole string: take the
// leftmost "KVG-", classify its run, redact / strip (and rescan the join) / stop at a leak.
func (w *world) reference(tenant string, echoes []string, text string) (out string, leak bool, nEcho int) {
	var sb strings.Builder
	rest := text
	for {
		j := strings.Index(rest, MarkerPrefix)
		if j < 0 {
			sb.WriteString(rest)
			return sb.String(), false, nEcho
		}
		r := 0
		for r < MarkerChars && j+4+r < len(rest) && strings.IndexByte(b32alphabet, rest[j+4+r]) >= 0 {
			r++
		}
		run := rest[j+4 : j+4+r]
		cls := "redact"
		if r >= FragmentMin {
			for m, o := range w.live {
				if m[4:12] != run[:8] {
					continue
				}
				switch {
				case o.Tenant == tenant:
					cls = "own"
				case contains(echoes, m):
					cls = "echo"
				default:
					cls = "leak"
				}
			}
		}
		switch cls {
		case "leak":
			sb.WriteString(rest[:j])
			return sb.String(), true, nEcho
		case "redact":
			// The prefix goes; the run stays for the folded detector.
			sb.WriteString(rest[:j])
			sb.WriteString(Redacted)
			rest = rest[j+4:]
		default:
			if cls == "echo" {
				nEcho++
			}
			rest = rest[:j] + rest[j+4+r:]
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// stream feeds text to a fresh scanner in pieces cut at the given offsets, then flushes.
func stream(k *Keyring, tenant string, echoes []string, text []byte, cuts []int) (out []byte, leak *Hit, echoes_ int, firstOut []byte) {
	s := k.NewScanner(tenant, echoes)
	prev := 0
	for n, c := range append(cuts, len(text)) {
		// A copy per event: the scanner must not keep references into the caller's text.
		ev := append([]byte(nil), text[prev:c]...)
		before := len(out)
		var v Verdict
		out, v = s.Feed(out, ev)
		for i := range ev {
			ev[i] = '#'
		}
		if n == 0 {
			firstOut = append([]byte(nil), out[before:]...)
		}
		echoes_ += len(v.Echoes)
		if v.Leak != nil {
			return out, v.Leak, echoes_, firstOut
		}
		prev = c
	}
	out, v := s.FlushVerdict(out)
	echoes_ += len(v.Echoes)
	return out, v.Leak, echoes_, firstOut
}

// textGen builds random texts from noise that likes to form near-markers, and planted items.
type textGen struct {
	w   *world
	rnd *rand.Rand
}

var noise = []string{"K", "V", "G", "-", "KV", "KVG", "KVG-", "a", "b", "z", "2", "7", " ", "\n",
	"hello ", "é", "中文", "😀", "Kx", "KVGx", "{\"", "\\n", "abcdefgh", "KVG-KV"}

func (g *textGen) noise(n int) string {
	var sb strings.Builder
	for i := 0; i < n; i++ {
		sb.WriteString(noise[g.rnd.Intn(len(noise))])
	}
	return sb.String()
}

func (g *textGen) liveOf(tenant string) string {
	for {
		for m, o := range g.w.live {
			if o.Tenant == tenant && g.rnd.Intn(4) == 0 {
				return m
			}
		}
	}
}

func (g *textGen) fragment(m string) string {
	return m[:4+FragmentMin+g.rnd.Intn(MarkerChars-FragmentMin+1)]
}

func randomB32(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = b32alphabet[r.Intn(32)]
	}
	return string(b)
}

func TestScannerPassesPlainTextUntouchedAtEverySplit(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	rnd := rand.New(rand.NewSource(1))
	texts := []string{"", "K", "KV", "KVG", "plain text", "ends with K", "ends with KV", "ends with KVG",
		"KVGKVKVG KV-G K-V-G", "中文 KVG 😀 KV", "VG-abcdefghijabcdefghij"}
	g := &textGen{w: w, rnd: rnd}
	for i := 0; i < 40; i++ {
		s := strings.ReplaceAll(g.noise(30), "KVG-", "KVG_")
		texts = append(texts, s)
	}
	for _, txt := range texts {
		if strings.Contains(txt, MarkerPrefix) {
			t.Fatalf("generator produced KVG- in %q", txt)
		}
		for cut := 0; cut <= len(txt); cut++ {
			out, leak, _, first := stream(w.k, "alice", nil, []byte(txt), []int{cut})
			if leak != nil || string(out) != txt {
				t.Fatalf("%q split at %d: got %q (leak %v), want it byte-identical", txt, cut, out, leak)
			}
			// Undelayed: the first event's text is emitted at once except a possible marker start.
			head := []byte(txt[:cut])
			want := head[:len(head)-chainSuffix(head, holdMax)]
			if !bytes.Equal(first, want) {
				t.Fatalf("%q split at %d: first event emitted %q, want %q", txt, cut, first, want)
			}
		}
	}
}

func TestScannerPropertiesAtEverySplit(t *testing.T) {
	w := newWorld(t, "alice", "bob", "carol", "dave")
	rnd := rand.New(rand.NewSource(42))
	g := &textGen{w: w, rnd: rnd}
	echoMarker := g.liveOf("carol") // carol's marker was in alice's prompt
	echoes := []string{echoMarker}
	const requester = "alice"

	kinds := []string{"foreign", "foreignFrag", "own", "ownFrag", "echo", "echoFrag", "unknown", "short", "noise"}
	cases := 0
	for iter := 0; iter < 1500; iter++ {
		var sb strings.Builder
		planted := map[string]int{}
		for p := 0; p < 1+rnd.Intn(3); p++ {
			sb.WriteString(g.noise(rnd.Intn(8)))
			kind := kinds[rnd.Intn(len(kinds))]
			planted[kind]++
			switch kind {
			case "foreign":
				sb.WriteString(g.liveOf([]string{"bob", "dave"}[rnd.Intn(2)]))
			case "foreignFrag":
				sb.WriteString(g.fragment(g.liveOf("bob")))
			case "own":
				sb.WriteString(g.liveOf(requester))
			case "ownFrag":
				sb.WriteString(g.fragment(g.liveOf(requester)))
			case "echo":
				sb.WriteString(echoMarker)
			case "echoFrag":
				sb.WriteString(g.fragment(echoMarker))
			case "unknown":
				sb.WriteString(MarkerPrefix + randomB32(rnd, MarkerChars))
			case "short":
				sb.WriteString(MarkerPrefix + randomB32(rnd, rnd.Intn(FragmentMin)))
			}
			sb.WriteString(g.noise(rnd.Intn(8)))
		}
		text := sb.String()
		wantOut, wantLeak, wantEcho := w.reference(requester, echoes, text)
		if planted["foreign"]+planted["foreignFrag"] > 0 && !wantLeak {
			t.Fatalf("reference missed a planted foreign marker in %q", text)
		}
		check := func(cuts []int) {
			cases++
			out, leak, nEcho, _ := stream(w.k, requester, echoes, []byte(text), cuts)
			if bytes.Contains(out, prefixBytes) {
				t.Fatalf("%q cuts %v: output contains KVG-: %q", text, cuts, out)
			}
			if (leak != nil) != wantLeak {
				t.Fatalf("%q cuts %v: leak %v, want %v", text, cuts, leak, wantLeak)
			}
			if string(out) != wantOut {
				t.Fatalf("%q cuts %v:\n got %q\nwant %q", text, cuts, out, wantOut)
			}
			if nEcho != wantEcho {
				t.Fatalf("%q cuts %v: %d echoes reported, want %d", text, cuts, nEcho, wantEcho)
			}
			if leak != nil {
				if leak.Victim != "bob" && leak.Victim != "dave" {
					t.Fatalf("%q: leak names victim %q", text, leak.Victim)
				}
				if strings.Contains(leak.Context, MarkerPrefix) {
					t.Fatalf("leak context carries KVG-: %q", leak.Context)
				}
			}
		}
		for cut := 0; cut <= len(text); cut++ {
			check([]int{cut})
		}
		for m := 0; m < 20; m++ {
			n := 1 + rnd.Intn(8)
			cuts := make([]int, n)
			for i := range cuts {
				cuts[i] = rnd.Intn(len(text) + 1)
			}
			sortInts(cuts)
			check(cuts)
		}
		// Every byte its own event: the worst case for held tails.
		every := make([]int, len(text))
		for i := range every {
			every[i] = i
		}
		check(every)
	}
	t.Logf("%d split cases checked", cases)
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func TestScannerCasesByName(t *testing.T) {
	w := newWorld(t, "alice", "bob", "carol")
	own, bob, carol := w.cur["alice"], w.cur["bob"], w.cur["carol"]
	echoes := []string{carol}
	for _, tc := range []struct {
		name, in, out string
		leak          bool
		echoes        int
	}{
		{"own stripped", "a " + own + " b", "a  b", false, 0},
		{"own fragment stripped", "a " + own[:14] + " b", "a  b", false, 0},
		{"foreign cut before marker", "hello " + bob + " secret", "hello ", true, 0},
		{"foreign fragment of 8", "hi " + bob[:12] + "!", "hi ", true, 0},
		{"foreign 7 chars: the prefix is redacted", "hi " + bob[:11] + "!", "hi " + Redacted + bob[4:11] + "!", false, 0},
		{"echo stripped and reported", "x" + carol + "y", "xy", false, 1},
		{"unknown: the prefix redacted", "x KVG-" + randomB32(rand.New(rand.NewSource(3)), 20) + " y", "x " + Redacted + randomB32(rand.New(rand.NewSource(3)), 20) + " y", false, 0},
		{"bare prefix redacted", "x KVG- y", "x " + Redacted + " y", false, 0},
		{"strip joins KV + G-", "KV" + own + "G-abc", Redacted + "abc", false, 0},
		{"strip joins KVG + -", "KVG" + own + "-", Redacted, false, 0},
		{"strip joins into a foreign marker", "K" + own + bob[1:], "", true, 0},
		{"run stops after 20 characters", own + "abcdef", "abcdef", false, 0},
		{"nested strips join across pieces", "K" + own + "V" + own + "G-", Redacted, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, v := w.k.ScanAll("alice", echoes, []byte(tc.in))
			if string(out) != tc.out || (v.Leak != nil) != tc.leak || len(v.Echoes) != tc.echoes {
				t.Fatalf("ScanAll(%q) = %q leak=%v echoes=%d; want %q leak=%v echoes=%d",
					tc.in, out, v.Leak != nil, len(v.Echoes), tc.out, tc.leak, tc.echoes)
			}
			if tc.leak && v.Leak.Victim != "bob" {
				t.Fatalf("victim %q, want bob", v.Leak.Victim)
			}
		})
	}
}

func TestScannerPathologicalChains(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	own := w.cur["alice"]
	// Long runs of "K" before own markers, ending in a join: never "KVG-", in one piece or split.
	text := []byte(strings.Repeat(strings.Repeat("K", 200)+own, 2000) + "VG-" + own[4:] + " tail")
	for _, cuts := range [][]int{nil, {len(text) / 3, len(text) / 2}, {5, 150, 201, 230}} {
		out, leak, _, _ := stream(w.k, "alice", nil, text, cuts)
		if leak != nil || bytes.Contains(out, prefixBytes) || !bytes.HasSuffix(out, []byte(" tail")) {
			t.Fatalf("cuts %v: leak=%v, KVG- in output=%v, suffix %q", cuts, leak, bytes.Contains(out, prefixBytes), out[max(0, len(out)-40):])
		}
	}
}

func TestScannerZeroAllocsPerEvent(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	own := w.cur["alice"]
	events := [][]byte{[]byte("The quick brown "), []byte("fox jumps K"), []byte("VG over the "),
		[]byte(own[:10]), []byte(own[10:] + " lazy"), []byte(" dog.\n中文 "), []byte("KV"), []byte("x")}
	s := w.k.NewScanner("alice", nil)
	dst := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(200, func() {
		dst = dst[:0]
		for _, ev := range events {
			var v Verdict
			dst, v = s.Feed(dst, ev)
			if v.Leak != nil {
				t.Fatal("unexpected leak")
			}
		}
		dst = s.Flush(dst)
		s.Reset("alice", nil)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per stream of %d events in steady state, want 0", allocs, len(events))
	}
	if want := "The quick brown fox jumps KVG over the  lazy dog.\n中文 KVx"; string(dst) != want {
		t.Fatalf("output %q, want %q", dst, want)
	}
}

// TestScannerPrefixCollision plants a foreign entry that shares the first 8 characters of
// alice's marker (a collision the HMAC makes rare, forced here) and checks that the scanner waits
// for the whole run and picks the candidate agreeing longest, at every split.
func TestScannerPrefixCollision(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	own := w.cur["alice"]
	k := w.k
	k.slow.Lock()
	old := k.ring()
	fake := markerRec{tenant: old.tenantIdx["bob"], epoch: 7}
	copy(fake.body[:], own[4:12])
	copy(fake.body[FragmentMin:], "zzzzzzzzzzzz")
	next := *old
	next.recs = append(old.recs[:len(old.recs):len(old.recs)], fake)
	next.nbase, next.base, next.delta = len(next.recs), buildWinSet(next.recs, 0, len(next.recs)), newWinSet(0)
	k.cur.Store(&next)
	k.slow.Unlock()
	fakeMarker := own[:12] + "zzzzzzzzzzzz"
	if o, ok := k.Lookup(fakeMarker); !ok || o.Tenant != "bob" || o.Epoch != 7 {
		t.Fatalf("planted entry not found: %+v %v", o, ok)
	}
	for _, tc := range []struct {
		in, out string
		leak    bool
	}{
		{"a " + own + " b", "a  b", false},             // exact own marker
		{"a " + own[:14] + " b", "a  b", false},        // agrees longer with own
		{"a " + fakeMarker + " b", "a ", true},         // exact foreign marker
		{"a " + own[:12] + "zz b", "a ", true},         // agrees longer with the foreign one
		{"a " + own[:12] + " b", "a ", true},           // tie: leak wins
		{"a " + own[:12] + "zzzzzzzzzzzz", "a ", true}, // foreign marker at the very end
		{"a " + own[:15], "a ", false},                 // own fragment at the end: stripped
	} {
		for cut := 0; cut <= len(tc.in); cut++ {
			out, leak, _, _ := stream(k, "alice", nil, []byte(tc.in), []int{cut})
			if string(out) != tc.out || (leak != nil) != tc.leak {
				t.Fatalf("%q cut at %d: %q leak=%v, want %q leak=%v", tc.in, cut, out, leak != nil, tc.out, tc.leak)
			}
			if leak != nil && leak.Victim != "bob" {
				t.Fatalf("%q: victim %q", tc.in, leak.Victim)
			}
		}
	}
}

func TestHitContext(t *testing.T) {
	w := newWorld(t, "alice", "bob", "carol")
	bob, carol := w.cur["bob"], w.cur["carol"]
	before := strings.Repeat("é", 80) + " own: " + w.cur["alice"] + " then "
	after := " more " + carol + strings.Repeat("x", 300)
	s := w.k.NewScanner("alice", nil)
	var out []byte
	var v Verdict
	for _, ev := range []string{before[:50], before[50:], bob[:6], bob[6:] + after} {
		out, v = s.Feed(out, []byte(ev))
	}
	if v.Leak == nil {
		t.Fatal("no leak")
	}
	ctx := v.Leak.Context
	if strings.Contains(ctx, "KVG-") || !utf8Valid(ctx) {
		t.Fatalf("context %q has KVG- or broken UTF-8", ctx)
	}
	if !strings.Contains(ctx, "own:  then [marker] more "+Redacted+"xx") || len(ctx) > 2*contextSide+len("[marker]") {
		t.Fatalf("context %q (%d bytes)", ctx, len(ctx))
	}
	if v.Leak.Marker != bob || v.Leak.Victim != "bob" {
		t.Fatalf("hit %+v", v.Leak)
	}
	// After the cut, nothing more is emitted.
	n := len(out)
	out, v2 := s.Feed(out, []byte("later text"))
	if len(out) != n || v2.Leak == nil {
		t.Fatal("scanner emitted text after a leak")
	}
}
