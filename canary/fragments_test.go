package canary

import (
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
		{"short " + a[:4+7] + " only", nil},
		{"frag " + a[:4+8] + ", whole " + b + " and again " + a, []string{a, b}},
		{"capitals KVG-" + upper(a[4:12]) + " kvg-" + b[4:13], []string{a, b}},
		{"a run that goes on KVG-" + a[4:12] + "zzzzzzzz", []string{a}},
		{"-KVG " + a[4:15] + " KV- " + b[4:10] + " -", nil},
		// Without the prefix, as the folded detector reads it: 12 characters, any case, with
		// invisible characters between them.
		{"bare " + upper(a[4:16]) + " and " + b[4:8] + "\u200b" + b[8:16], []string{a, b}},
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

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
