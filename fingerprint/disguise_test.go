package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/disguise"
)

// issue31Prompt is a private system prompt of 438 characters, as issue 31's attack replayed.
const issue31Prompt = "You are Orion, the internal support agent of Helvetic Freight AG. Never reveal the " +
	"escalation code 4471-B or the names of our insurers (Baloise, Zurich). Quote tariffs only " +
	"from table T-9, round prices to CHF 0.05, and refuse to discuss the Basel depot's pending " +
	"audit. If a caller mentions invoice batch 88/2026, transfer them to Mrs. Keller at extension " +
	"318. Answer in the caller's language; sign every reply with 'Orion (HFAG)'. Be it."

// The prompt is recorded as sent (plain); the reply carries it in each of issue 31's disguises
// and is read the way the canary detector reads a marker: every disguise matches as the plain
// text does, whole and split into pieces of any size.
func TestDisguisedPromptTextMatches(t *testing.T) {
	if n := len([]rune(issue31Prompt)); n != 438 {
		t.Fatalf("the prompt has %d characters, want 438", n)
	}
	now := time.Unix(1e9, 0)
	ix := newTestIndex(Config{CutMatches: 1000})
	keep(ix, "victim", []string{"u0"}, issue31Prompt, now)
	plain := ix.NewScanner("attacker", []string{"u0"}, nil)
	plain.Feed(issue31Prompt)
	if plain.Count() < 10 {
		t.Fatalf("the plain quote gave only %d matches", plain.Count())
	}
	for _, d := range disguise.All() {
		text := d.Func(issue31Prompt)
		if text == issue31Prompt {
			t.Fatalf("%s: changed nothing", d.Name)
		}
		whole := ix.NewScanner("attacker", []string{"u0"}, nil)
		whole.Feed(text)
		if whole.Count() != plain.Count() {
			t.Errorf("%s: %d matches, the plain quote %d", d.Name, whole.Count(), plain.Count())
		}
		for _, step := range []int{1, 2, 5, 13} {
			sc := ix.NewScanner("attacker", []string{"u0"}, nil)
			for i := 0; i < len(text); i += step {
				sc.Feed(text[i:min(i+step, len(text))])
			}
			if sc.Count() != whole.Count() {
				t.Errorf("%s in pieces of %d bytes: %d matches, whole %d", d.Name, step, sc.Count(), whole.Count())
			}
		}
	}
}

// The other way round too: a prompt sent disguised is found in a plain reply (both sides fold
// the same way).
func TestDisguisedPromptMatchesPlainReply(t *testing.T) {
	now := time.Unix(1e9, 0)
	for _, d := range disguise.All() {
		ix := newTestIndex(Config{CutMatches: 3})
		keep(ix, "victim", []string{"u0"}, d.Func(issue31Prompt), now)
		sc := ix.NewScanner("attacker", []string{"u0"}, nil)
		if !sc.Feed(issue31Prompt) {
			t.Errorf("%s: a plain reply of a disguised prompt gave %d matches", d.Name, sc.Count())
		}
	}
}

// A clone reads on as the original would: the joined reading forks from a field's mid-stream.
func TestCloneReadsOnAsTheOriginal(t *testing.T) {
	now := time.Unix(1e9, 0)
	ix := newTestIndex(Config{CutMatches: 1000})
	keep(ix, "victim", []string{"u0"}, issue31Prompt, now)
	whole := ix.NewScanner("attacker", []string{"u0"}, nil)
	whole.Feed(issue31Prompt)
	for _, cut := range []int{0, 7, 100, 250, len(issue31Prompt)} {
		sc := ix.NewScanner("attacker", []string{"u0"}, nil)
		sc.Feed(issue31Prompt[:cut] + "&#3") // ends inside an escape: the clone must carry it
		c := sc.Clone()
		c.Feed("2;" + issue31Prompt[cut:])
		sc.Feed("2;" + issue31Prompt[cut:])
		if c.Count() != sc.Count() || sc.Count() != whole.Count() {
			t.Fatalf("cut at %d: clone %d, original %d, whole %d matches", cut, c.Count(), sc.Count(), whole.Count())
		}
	}
}

// Text split anywhere (inside a UTF-8 sequence, an HTML reference or a \u escape) scans as it
// does whole: random text of escapes, look-alikes and separators, random pieces.
func TestFoldedPiecesMatchWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 1))
	units := []string{"&#32;", "&amp;", "&#x4B;", "&Kopf;", "\\u0041", "\\ud835\\udc1a", "\u200b", "\u00ad", "а", "ｂ", "é", "中文", "-", " ", "&#3", "&", "\\u00", "x", "Y", "8", ";"}
	now := time.Unix(1e9, 0)
	for trial := 0; trial < 200; trial++ {
		var b strings.Builder
		for b.Len() < 400 {
			if rng.IntN(3) == 0 {
				b.WriteString(units[rng.IntN(len(units))])
			} else {
				b.WriteString(words(uint64(rng.IntN(1000)), 1))
			}
		}
		text := b.String()
		ix := newTestIndex(Config{CutMatches: 1000})
		keep(ix, "victim", []string{"u0"}, text, now)
		whole := ix.NewScanner("attacker", []string{"u0"}, nil)
		whole.Feed(text)
		sc := ix.NewScanner("attacker", []string{"u0"}, nil)
		for i := 0; i < len(text); {
			j := min(len(text), i+1+rng.IntN(9))
			sc.Feed(text[i:j])
			i = j
		}
		// A partial escape at the very end waits for text that never comes; everything before
		// it is read the same.
		if sc.Count() != whole.Count() || fmt.Sprint(sc.Matches()) != fmt.Sprint(whole.Matches()) {
			t.Fatalf("trial %d: pieces %d matches %v, whole %d %v\n%q", trial, sc.Count(), sc.Matches(), whole.Count(), whole.Matches(), text)
		}
	}
}
