package canary

import (
	"strings"
	"testing"
	"time"
)

func TestFindMarkerFragments(t *testing.T) {
	k := NewKeyring([]byte("s"), time.Hour, 24*time.Hour, []string{"a", "b"})
	a, _ := k.Current("a", time.Now())
	b, _ := k.Current("b", time.Now())
	for _, c := range []struct {
		text string
		want []string
	}{
		{"nothing here", nil},
		{"short " + a[:4+7] + "! only", nil},
		{"frag " + a[:4+8] + ", whole " + b + " and again " + a, []string{a, b}},
		{"frag " + a[:4+8] + ", whole " + b, []string{desc(a, 0, 8), b}},
		{"capitals KVG-" + upper(a[4:12]) + "! kvg-" + b[4:13], []string{desc(a, 0, 8), desc(b, 0, 9)}},
		{"a run that goes on KVG-" + a[4:12] + strings.Repeat(string(notNext(a[12])), 8), []string{desc(a, 0, 8)}},
		{"-KVG " + a[4:11] + "! KV- " + b[4:10] + " -", nil},
		// As the folded detector reads it: any offset, any case, invisible characters between
		// them, reversed; two pieces of one marker are one descriptor. Separators are
		// transparent, so every piece is fenced by '!' (a break): a neighbouring word's letter
		// would otherwise extend the run in the hours when the marker's next character is it.
		{"bare !" + upper(a[8:16]) + "! and " + b[4:8] + "\u200b" + b[8:16], []string{desc(a, 4, 12), desc(b, 0, 12)}},
		{"back !" + string(reversed([]byte(a[10:22]))) + "! and " + a[4:12], []string{desc(a, 0, 18)}},
	} {
		got := k.FindMarkerFragments(c.text)
		if len(got) != len(c.want) {
			t.Fatalf("%q: %v, want %v", c.text, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("%q: %v, want %v", c.text, got, c.want)
			}
		}
	}
}

// notNext is a marker character other than c (so it does not continue a run at c).
func notNext(c byte) byte {
	if c == 'z' {
		return 'y'
	}
	return 'z'
}

// desc is the echo descriptor of marker m holding body characters [lo, hi).
func desc(m string, lo, hi int) string {
	b := []byte(m)
	for i := 0; i < MarkerChars; i++ {
		if i < lo || i >= hi {
			b[len(MarkerPrefix)+i] = '?'
		}
	}
	return string(b)
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
