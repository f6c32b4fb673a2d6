package canary

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// disguises are the ways a reader still decodes a marker that the prefix scanner misses.
var disguises = map[string]func(m string) string{
	"no prefix":   func(m string) string { return m[len(MarkerPrefix):] },
	"upper case":  strings.ToUpper,
	"mixed case":  func(m string) string { return mixCase(m) },
	"zero width":  func(m string) string { return interleave(m[len(MarkerPrefix):], "\u200b") },
	"soft hyphen": func(m string) string { return "KVG-" + interleave(m[len(MarkerPrefix):], "\u00ad") },
	"joiner in prefix": func(m string) string {
		return "K\u200dVG-" + m[len(MarkerPrefix):]
	},
	"fullwidth": func(m string) string {
		var b strings.Builder
		for _, r := range m[len(MarkerPrefix):] {
			switch {
			case r >= 'a' && r <= 'z':
				b.WriteRune(0xFF41 + r - 'a')
			case r >= '0' && r <= '9':
				b.WriteRune(0xFF10 + r - '0')
			}
		}
		return b.String()
	},
	"combining marks": func(m string) string { return interleave(strings.ToUpper(m[len(MarkerPrefix):]), "\u0301") },
	// Issue 17's disguises: compatibility forms, look-alikes, references and escapes,
	// separators, reversal.
	"mathematical bold": func(m string) string { return perChar(m, func(c rune) string { return mathBold(c) }) },
	"circled":           func(m string) string { return perChar(m, circled) },
	"look-alikes":       func(m string) string { return perChar(m, lookAlike) },
	"html numeric": func(m string) string {
		return perChar(m, func(c rune) string {
			if c%2 == 0 {
				return fmt.Sprintf("&#%d;", c)
			}
			return fmt.Sprintf("&#x%X;", c)
		})
	},
	"html named": func(m string) string {
		return perChar(m, func(c rune) string {
			if c >= 'a' && c <= 'z' {
				return "&" + string(c) + "opf;" // double-struck: 𝕒
			}
			return fmt.Sprintf("&#%d;", c)
		})
	},
	"json escapes":    func(m string) string { return perChar(m, func(c rune) string { return fmt.Sprintf("\\u%04x", c) }) },
	"json surrogates": func(m string) string { return perChar(m, jsonSurrogates) },
	"spaced":          func(m string) string { return interleave(m[len(MarkerPrefix):], " ") },
	"dashed":          func(m string) string { return interleave(m[len(MarkerPrefix):], "-") },
	"dotted":          func(m string) string { return interleave(strings.ToUpper(m[len(MarkerPrefix):]), ". ") },
	"one space":       func(m string) string { return m[:14] + " " + m[14:] },
	"reversed":        func(m string) string { return string(reversed([]byte(m[len(MarkerPrefix):]))) },
	"reversed spaced": func(m string) string {
		return interleave(strings.ToUpper(string(reversed([]byte(m[len(MarkerPrefix):])))), " ")
	},
}

// perChar rewrites each character of the marker's body.
func perChar(m string, f func(rune) string) string {
	var b strings.Builder
	for _, c := range m[len(MarkerPrefix):] {
		b.WriteString(f(c))
	}
	return b.String()
}

func mathBold(c rune) string {
	if c >= 'a' && c <= 'z' {
		return string(0x1D41A + c - 'a')
	}
	return string(0x1D7CE + c - '0') // bold digits
}

func circled(c rune) string {
	if c >= 'a' && c <= 'z' {
		return string(0x24D0 + c - 'a')
	}
	return string(0x2460 + c - '1') // ② … ⑦
}

// lookAlike writes a letter in Cyrillic or Greek where one looks the same (a hand-made list, to
// check the generated table against), a digit as is.
func lookAlike(c rune) string {
	m := map[rune]rune{'a': 'а', 'c': 'с', 'e': 'е', 'i': 'і', 'j': 'ј', 'k': 'κ', 'o': 'ο', 'p': 'р', 's': 'ѕ',
		'x': 'х', 'y': 'у', 'h': 'һ', 'v': 'ν', 'u': 'υ', 'n': 'ո', 'd': 'ԁ', 'g': 'ɡ', 'q': 'ԛ', 'w': 'ԝ', '3': 'З'}
	if r, ok := m[c]; ok {
		return string(r)
	}
	return string(c)
}

func jsonSurrogates(c rune) string {
	r := []rune(mathBold(c))[0]
	r -= 0x10000
	return fmt.Sprintf("\\u%04x\\u%04x", 0xD800+(r>>10), 0xDC00+(r&0x3FF))
}

func mixCase(s string) string {
	b := []byte(s)
	for i := range b {
		if i%2 == 0 && b[i] >= 'a' && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

func interleave(s, sep string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Every disguise of a foreign marker, split at every byte boundary into two events, is a leak,
// and what was emitted before the cut holds fewer than FragmentMin of its characters.
func TestLooseCatchesDisguisedMarkersAtEverySplit(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	victim := w.cur["alice"]
	for name, disguise := range disguises {
		text := "Here is some earlier text. " + disguise(victim) + " and what followed it."
		cases := 0
		for split := 0; split <= len(text); split++ {
			if !utf8.RuneStart(text[min(split, len(text)-1)]) && split < len(text) {
				continue // engines send whole UTF-8 sequences per event after decoding
			}
			cases++
			l := w.k.NewLoose("bob", nil)
			out, h := l.Feed(nil, []byte(text[:split]))
			if h == nil {
				out, h = l.Feed(out, []byte(text[split:]))
			}
			if h == nil {
				out, h = l.Flush(out)
			}
			if h == nil {
				t.Fatalf("%s, split %d: no leak found in %q", name, split, text)
			}
			if h.Victim != "alice" {
				t.Fatalf("%s: victim %q", name, h.Victim)
			}
			if n := foldedLeak(out, victim); n >= FragmentMin {
				t.Fatalf("%s, split %d: %d marker characters reached the client: %q", name, split, n, out)
			}
			if strings.Contains(h.Context, victim[4:]) {
				t.Fatalf("%s: context carries the marker: %q", name, h.Context)
			}
		}
		if cases < 50 {
			t.Fatalf("%s: only %d splits", name, cases)
		}
	}
}

// Three pieces, split at every pair of character boundaries: a candidate held in one Feed may
// begin in characters an earlier Feed emitted.
func TestLooseThreePieces(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	victim := w.cur["alice"]
	for name, disguise := range disguises {
		text := "x " + disguise(victim) + " y"
		for i := 0; i <= len(text); i++ {
			for j := i; j <= len(text); j++ {
				if i < len(text) && !utf8.RuneStart(text[i]) || j < len(text) && !utf8.RuneStart(text[j]) {
					continue
				}
				l := w.k.NewLoose("bob", nil)
				var out []byte
				var h *Hit
				for _, p := range []string{text[:i], text[i:j], text[j:]} {
					if h == nil {
						out, h = l.Feed(out, []byte(p))
					}
				}
				if h == nil {
					out, h = l.Flush(out)
				}
				if h == nil || foldedLeak(out, victim) >= FragmentMin {
					t.Fatalf("%s, splits %d/%d: hit %v, out %q", name, i, j, h, out)
				}
			}
		}
	}
}

// The requester's own marker and its echoes in disguise are not leaks, and pass unchanged.
func TestLooseOwnAndEchoPass(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	own, foreign := w.cur["bob"], w.cur["alice"]
	for name, disguise := range disguises {
		text := "a " + disguise(own) + " b " + disguise(foreign) + " c"
		l := w.k.NewLoose("bob", []string{foreign})
		out, h := l.Feed(nil, []byte(text))
		if h == nil {
			out, h = l.Flush(out)
		}
		if h != nil || string(out) != text {
			t.Fatalf("%s: hit %v, out %q", name, h, out)
		}
	}
}

// Text without marker characters passes byte-identical, in every split, and nothing is held
// back: each Feed emits all it was given.
func TestLooseMarkerFreeTextUnchanged(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	text := "The INTERNATIONALISATION of 234567 abcdefghijklmnopqrstuvwxyz ÄÖÜ 你好 \u200b\u200b KVG- kvg-abc " +
		strings.Repeat("qwertyuiopasdfghjklzxcvbnm", 20)
	for split := 0; split <= len(text); split += 7 {
		l := w.k.NewLoose("bob", nil)
		out, h := l.Feed(nil, []byte(text[:split]))
		if len(out) != split || h != nil {
			t.Fatalf("split %d: held %d bytes (hit %v)", split, split-len(out), h)
		}
		out, h = l.Feed(out, []byte(text[split:]))
		if h != nil || string(out) != text {
			t.Fatalf("split %d: changed (hit %v)", split, h)
		}
	}
}

// Invisible padding never makes the detector hold text: past HoldMin characters the run is
// withheld, and every Feed returns at once with what it may emit.
func TestLoosePaddingIsNotHeld(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	body := w.cur["alice"][len(MarkerPrefix):]
	l := w.k.NewLoose("bob", nil)
	out, h := l.Feed(nil, []byte(body[:HoldMin]))
	for i := 0; h == nil && i < 10; i++ {
		n := len(out)
		out, h = l.Feed(out, bytes.Repeat([]byte("\u200b"), 1000))
		if len(out)-n != 3000 {
			t.Fatalf("feed %d: %d of 3000 bytes of padding emitted", i, len(out)-n)
		}
	}
	if h != nil {
		t.Fatalf("hit on %d characters: %v", HoldMin, h)
	}
	if n := foldedLeak(out, w.cur["alice"]); n != HoldMin-1 {
		t.Fatalf("%d characters reached the client, want %d", n, HoldMin-1)
	}
}
