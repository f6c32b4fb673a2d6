package canary

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// feedSplits feeds text to a fresh Loose for bob cut at the given byte offsets.
func feedSplits(l *Loose, text string, cuts ...int) ([]byte, *Hit) {
	var out []byte
	var h *Hit
	prev := 0
	for _, c := range append(cuts, len(text)) {
		if h == nil {
			out, h = l.Feed(out, []byte(text[prev:c]))
		}
		prev = c
	}
	if h == nil {
		out, h = l.Flush(out)
	}
	return out, h
}

var offsetDisguises = map[string]func(s string) string{
	"plain":      func(s string) string { return s },
	"upper case": strings.ToUpper,
	"zero width": func(s string) string { return interleave(s, "\u200b") },
	"fullwidth": func(s string) string {
		var b strings.Builder
		for _, r := range strings.ToUpper(s) {
			switch {
			case r >= 'A' && r <= 'Z':
				b.WriteRune(0xFF21 + r - 'A')
			case r >= '0' && r <= '9':
				b.WriteRune(0xFF10 + r - '0')
			}
		}
		return b.String()
	},
}

// A run of at least LooseMin characters of a foreign marker's body is a leak from any offset of
// the body, in every disguise and split in two at every character boundary; a run of HoldMin to
// LooseMin−1 is no leak but is withheld from its HoldMin-th character; the requester's own
// marker and its echoes pass unchanged, and a character beyond an echo is foreign.
func TestLooseDetectsRunsAtAnyOffset(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	victim, own := w.cur["alice"], w.cur["bob"]
	vb, ob := victim[len(MarkerPrefix):], own[len(MarkerPrefix):]
	echoVictim := w.cur["alice"] // bob's prompt carried alice's marker
	cases := []struct {
		name   string
		run    string
		echoes []string
		leak   bool
		redact bool
	}{
		{"suffix of 19", vb[1:], nil, true, false},
		{"last 13", vb[7:], nil, true, false},
		{"middle 13", vb[3:16], nil, true, false},
		{"exactly LooseMin from offset 5", vb[5 : 5+LooseMin], nil, true, false},
		{"exactly LooseMin at the end", vb[MarkerChars-LooseMin:], nil, true, false},
		{"whole body", vb, nil, true, false},
		{"LooseMin-1 from offset 5", vb[5 : 5+LooseMin-1], nil, false, true},
		{"LooseMin-1 at the end", vb[MarkerChars-LooseMin+1:], nil, false, true},
		{"HoldMin at the start", vb[:HoldMin], nil, false, true},
		{"HoldMin-1 in the middle", vb[6 : 6+HoldMin-1], nil, false, false},
		{"own suffix of 19", ob[1:], nil, false, false},
		{"own middle 13", ob[3:16], nil, false, false},
		{"echo middle 13", vb[3:16], []string{echoVictim}, false, false},
		{"echo suffix of 19", vb[1:], []string{echoVictim}, false, false},
		{"exact echo of a middle 13", vb[3:16], []string{desc(victim, 3, 16)}, false, false},
		{"one character beyond a middle 13", vb[3:17], []string{desc(victim, 3, 16)}, true, false},
		{"the rest after an echoed start", vb[8:], []string{desc(victim, 0, 12)}, true, false},
	}
	for _, tc := range cases {
		for dname, disguise := range offsetDisguises {
			text := "Earlier words, then: " + disguise(tc.run) + " ;and what followed." // ':' and ';' break runs
			name := tc.name + "/" + dname
			splits := 0
			for split := -1; split <= len(text); split++ {
				var cuts []int
				if split >= 0 {
					if split < len(text) && !utf8.RuneStart(text[split]) {
						continue
					}
					cuts = []int{split}
				}
				splits++
				out, h := feedSplits(w.k.NewLoose("bob", tc.echoes), text, cuts...)
				if !prefixUpToRedacted(text, out) {
					t.Fatalf("%s, split %d: output is not a prefix: %q", name, split, out)
				}
				if !tc.leak {
					if h != nil || (string(out) != text) != tc.redact {
						t.Fatalf("%s, split %d: hit %v, out %q", name, split, h, out)
					}
					if n := bodyRun(out, victim); tc.redact && n >= HoldMin {
						t.Fatalf("%s, split %d: %d marker characters reached the client: %q", name, split, n, out)
					}
					continue
				}
				if h == nil {
					t.Fatalf("%s, split %d: no leak found in %q", name, split, text)
				}
				if h.Victim != "alice" || len(h.Marker) < LooseMin || !strings.Contains(vb, h.Marker) {
					t.Fatalf("%s: hit %+v", name, h)
				}
				// Whatever the splits, at most HoldMin−1 characters of the run were emitted, or
				// what the requester sent itself.
				limit := HoldMin
				if tc.echoes != nil {
					limit = strings.Count(tc.echoes[0], "?")
					limit = MarkerChars - limit + 1
				}
				if n := bodyRun(out, victim); n >= limit {
					t.Fatalf("%s, split %d: %d marker characters reached the client: %q", name, split, n, out)
				}
				if strings.Contains(string(readView([]byte(h.Context))), string(classes(h.Marker))) {
					t.Fatalf("%s: context carries the run: %q", name, h.Context)
				}
			}
			if splits < 40 {
				t.Fatalf("%s: only %d splits", name, splits)
			}
		}
	}
}

// The run split into three Feeds at every pair of character boundaries is still found.
func TestLooseOffsetRunThreePieces(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	vb := w.cur["alice"][len(MarkerPrefix):]
	text := "x " + interleave(strings.ToUpper(vb[4:17]), "\u00ad") + " y"
	for i := 0; i <= len(text); i++ {
		for j := i; j <= len(text); j++ {
			if i < len(text) && !utf8.RuneStart(text[i]) || j < len(text) && !utf8.RuneStart(text[j]) {
				continue
			}
			out, h := feedSplits(w.k.NewLoose("bob", nil), text, i, j)
			if h == nil || bodyRun(out, w.cur["alice"]) >= LooseMin {
				t.Fatalf("splits %d/%d: hit %v, out %q", i, j, h, out)
			}
		}
	}
}

// natural returns n bytes of prose-, code- and log-like text with long words, identifiers and
// base32-like ids (which make long folded runs), from rnd.
func natural(rnd *rand.Rand, n int) string {
	words := []string{"the", "scheduler", "evicts", "pages", "internationalisation", "KVCacheManager",
		"func", "(s *Server)", "return", "nil", "err", "2024-05-07T12:34:56Z", "INFO", "request_id=",
		"deadbeefcafe", "abcdefghijklmnopqrstuvwxyz234567", "大型语言模型", "ÄÖÜ", "\u200b", "Ｆｕｌｌ",
		"sha256:", "VGVzdGluZ0Jhc2U2NA", "counterrevolutionaries", "ZZZZZZZZZZZZZ", "\n", ", ", ". "}
	var b strings.Builder
	for b.Len() < n {
		switch rnd.Intn(4) {
		case 0:
			b.WriteString(randomB32(rnd, 4+rnd.Intn(24)))
		default:
			b.WriteString(words[rnd.Intn(len(words))])
		}
		if rnd.Intn(3) > 0 {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// Property: random natural-ish text with a run of LooseMin..20 characters of a foreign marker
// planted at a random offset of its body, in a random disguise, cut into random Feeds, is always
// a hit, the output is a prefix of the text, and fewer than LooseMin of the run's characters
// reach the client. The same text without the plant (or with a run of LooseMin−1, set apart by
// spaces) passes byte for byte.
func TestLooseOffsetProperty(t *testing.T) {
	w := newWorld(t, "alice", "bob", "carol")
	victim := w.cur["alice"]
	vb := victim[len(MarkerPrefix):]
	names := make([]string, 0, len(offsetDisguises))
	for n := range offsetDisguises {
		names = append(names, n)
	}
	sortStrings(names)
	rnd := rand.New(rand.NewSource(17))
	randomCuts := func(text string) []int {
		var cuts []int
		for n := rnd.Intn(8); n > 0 && len(text) > 0; n-- {
			c := rnd.Intn(len(text) + 1)
			for c > 0 && c < len(text) && !utf8.RuneStart(text[c]) {
				c--
			}
			cuts = append(cuts, c)
		}
		sortInts(cuts)
		return cuts
	}
	for iter := 0; iter < 3000; iter++ {
		base := natural(rnd, 50+rnd.Intn(400))
		p := rnd.Intn(len(base) + 1)
		for p > 0 && p < len(base) && !utf8.RuneStart(base[p]) {
			p--
		}
		kind := rnd.Intn(3)
		length := LooseMin + rnd.Intn(MarkerChars-LooseMin+1)
		if kind == 1 {
			length = LooseMin - 1
		}
		off := rnd.Intn(MarkerChars - length + 1)
		run := offsetDisguises[names[rnd.Intn(len(names))]](vb[off : off+length])
		text := base
		switch kind {
		case 0:
			text = base[:p] + run + base[p:]
		case 1:
			text = base[:p] + "; " + run + " ;" + base[p:] // spaces are separators, ';' breaks
		}
		cuts := randomCuts(text)
		out, h := feedSplits(w.k.NewLoose("bob", nil), text, cuts...)
		if !prefixUpToRedacted(text, out) {
			t.Fatalf("iter %d: output is not a prefix of the text", iter)
		}
		desc := fmt.Sprintf("iter %d: kind %d, run %q (offset %d, %d chars) in %q cut at %v", iter, kind, run, off, length, text, cuts)
		if kind != 0 {
			if h != nil || (string(out) != text) != (kind == 1) {
				t.Fatalf("%s: hit %v, changed %v", desc, h, string(out) != text)
			}
			if n := bodyRun(out, victim); n >= HoldMin {
				t.Fatalf("%s: %d characters reached the client", desc, n)
			}
			continue
		}
		if h == nil || h.Victim != "alice" {
			t.Fatalf("%s: hit %v", desc, h)
		}
		if n := bodyRun(out, victim); n >= HoldMin {
			t.Fatalf("%s: %d characters reached the client", desc, n)
		}
	}
}

// Windows are dropped with their epoch: after the detect window has passed, a run of an expired
// marker is no longer a hit, and live ones still are.
func TestLooseWindowsFollowRefresh(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	old := Marker(w.secret, "alice", w.k.Epoch(w.now.Add(-6*time.Hour)))
	if _, ok := w.k.Lookup(old); !ok {
		t.Fatal("oldest epoch not live")
	}
	hit := func(m string) bool {
		_, h := feedSplits(w.k.NewLoose("bob", nil), "x "+m[7:20]+" y")
		return h != nil
	}
	if !hit(old) || !hit(w.cur["alice"]) {
		t.Fatal("live runs not found")
	}
	w.k.Refresh(w.now.Add(2 * time.Hour))
	if hit(old) {
		t.Fatal("expired marker still detected")
	}
	if !hit(w.cur["alice"]) {
		t.Fatal("live marker lost after refresh")
	}
	r := w.k.ring()
	filled := 0
	for _, set := range []winSet{r.base, r.delta} {
		for _, s := range set.slots {
			if s != 0 {
				filled++
			}
		}
	}
	nrec := len(r.recs)
	if want := w.k.LiveMarkers() * windowsPerRec; filled != want || nrec != w.k.LiveMarkers() {
		t.Fatalf("%d windows for %d live markers (%d records)", filled, w.k.LiveMarkers(), nrec)
	}
}

// The fast path probes a run's 7-character windows only at even run lengths (winSet): an
// 8-character stretch of a foreign marker is withheld from its 8th character whatever the
// parity of the run before it, from every offset, both ways, whichever characters before it took
// the slow path (an escape, a look-alike), and cut at character boundaries (as replies are).
func TestLooseHoldsEightAtEveryParity(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	vb := w.cur["alice"][len(MarkerPrefix):]
	slow := map[string]func(string) string{
		"fast":   func(s string) string { return s },
		"escape": func(s string) string { return "&#" + fmt.Sprint(int(s[0])) + ";" + s[1:] },
		"fullwidth": func(s string) string {
			return string(rune(0xFF41+rune(s[0])-'a')) + s[1:]
		},
	}
	for lead := 0; lead <= 9; lead++ {
		// lead characters that read as marker characters but no live marker's: "8" and "9"
		// break a run, so use letters the victim's stretch follows with a separator.
		prefix := strings.Repeat("zq", 5)[:lead]
		for off := 0; off+HoldMin <= MarkerChars; off++ {
			for _, rev := range []bool{false, true} {
				run := []byte(vb[off : off+HoldMin])
				if rev {
					run = reversed(run)
				}
				for how, f := range slow {
					text := "say " + prefix + " " + f(string(run)) + " end"
					for cut := 0; cut <= len(text); cut++ {
						if cut < len(text) && !utf8.RuneStart(text[cut]) {
							continue
						}
						out, h := feedSplits(w.k.NewLoose("bob", nil), text, cut)
						if h != nil {
							t.Fatalf("%q: 8 characters are no leak: %+v", text, h)
						}
						if bytes.Contains(readView(out), classes(string(run))) || !strings.Contains(string(out), Redacted) {
							t.Fatalf("lead %d off %d rev %v %s cut %d: %q reached the client", lead, off, rev, how, cut, out)
						}
					}
				}
			}
		}
	}
}
