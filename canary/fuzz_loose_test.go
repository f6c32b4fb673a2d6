package canary

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzLoose: bob's replies, any text, cut into events at character boundaries (a relay decodes
// JSON, so every event is whole UTF-8). Two properties:
//   - marker-free text: when no hit is reported, what reaches the client is the text, byte for
//     byte; with a hit, it is a prefix of the text;
//   - a planted foreign marker (alice's, in any of the disguises) at any offset is always a
//     hit, and fewer than FragmentMin of its characters (folded) reach the client.
func FuzzLoose(f *testing.F) {
	w := newWorld(f, "alice", "bob")
	victim, own := w.cur["alice"], w.cur["bob"]
	names := make([]string, 0, len(disguises))
	for n := range disguises {
		names = append(names, n)
	}
	sortStrings(names)
	for _, s := range []string{"", "hello world", "KVG-", own, own[4:], strings.ToUpper(own), "ＡＢＣ", "a\u200bb\u0301c",
		strings.Repeat("abcdefghijklmnopqrstuvwxyz234567", 4), "中文 text 😀", victim[4 : 4+FragmentMin-1]} {
		f.Add(s, uint16(0), uint8(0), uint64(1))
		f.Add(s, uint16(len(s)/2), uint8(3), uint64(0x9e3779b97f4a7c15))
	}
	f.Fuzz(func(t *testing.T, text string, at uint16, plant uint8, cutSeed uint64) {
		if len(text) > 1<<12 {
			return
		}
		text = strings.ToValidUTF8(text, "\uFFFD")
		planted := plant%2 == 1
		var marker string
		if planted {
			p := int(at) % (len(text) + 1)
			for p > 0 && p < len(text) && !utf8.RuneStart(text[p]) {
				p--
			}
			marker = disguises[names[int(plant/2)%len(names)]](victim)
			// Spaces around it: a disguise must not merge with fuzzed invisible marks into
			// something a reader would not decode either.
			text = text[:p] + " " + marker + " " + text[p:]
		}
		var cuts []int
		x := cutSeed
		for n := int(x % 9); n > 0 && len(text) > 0; n-- {
			x = x*6364136223846793005 + 1442695040888963407
			c := int(x>>33) % (len(text) + 1)
			for c > 0 && c < len(text) && !utf8.RuneStart(text[c]) {
				c--
			}
			cuts = append(cuts, c)
		}
		sortInts(cuts)
		l := w.k.NewLoose("bob", nil)
		var out []byte
		var hit *Hit
		prev := 0
		for _, c := range append(cuts, len(text)) {
			if hit == nil {
				out, hit = l.Feed(out, []byte(text[prev:c]))
			}
			prev = c
		}
		if hit == nil {
			out, hit = l.Flush(out)
		}
		if !prefixUpToRedacted(text, out) {
			t.Fatalf("output is not a prefix of the text: %q → %q", text, out)
		}
		if hit == nil && string(out) != text {
			t.Fatalf("no hit, but the text changed: %q → %q", text, out)
		}
		if planted {
			if hit == nil {
				t.Fatalf("planted %q not found in %q cut at %v", marker, text, cuts)
			}
			if n := foldedLeak(out, victim); n >= FragmentMin {
				t.Fatalf("%d characters of the planted marker reached the client: %q", n, out)
			}
		}
	})
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
