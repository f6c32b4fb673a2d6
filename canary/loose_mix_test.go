package canary

import (
	"math/rand"
	"strings"
	"testing"
)

// Feed and FeedAll on one Loose, in any order: a partial escape that ended a FeedAll (emitted
// with its value) and is still partial after the next Feed must not be emitted twice or make the
// slice bounds cross (it panicked: b[emit:end] with emit > end); what reaches the client is the
// text, byte for byte, and a marker spelled in escapes across the calls is still a hit.
func TestLooseMixesFeedAndFeedAll(t *testing.T) {
	w := newWorld(t, "alice", "bob")
	// The case that panicked: FeedAll ends in "&#1", the next Feed leaves it partial.
	l := w.k.NewLoose("bob", nil)
	out, h := l.FeedAll(nil, []byte("abc &#1"))
	out2, h2 := l.Feed(nil, []byte("0"))
	out3, h3 := l.Flush(nil)
	if h != nil || h2 != nil || h3 != nil {
		t.Fatalf("hits %v %v %v", h, h2, h3)
	}
	if got := string(out) + string(out2) + string(out3); got != "abc &#10" {
		t.Fatalf("client saw %q, want %q", got, "abc &#10")
	}

	victim := w.cur["alice"]
	escaped := perChar(victim, func(c rune) string { return "&#" + string('0'+c/100) + string('0'+c/10%10) + string('0'+c%10) + ";" })
	rnd := rand.New(rand.NewSource(3))
	for trial := 0; trial < 2000; trial++ {
		parts := []string{"plain text ", "&#65;", "&#x6", "\\u00", "41", ";", "你好", " ", "&amp", "\\u0041"}
		var sb strings.Builder
		for sb.Len() < 60 {
			sb.WriteString(parts[rnd.Intn(len(parts))])
		}
		planted := trial%2 == 1
		if planted {
			sb.WriteString(" " + escaped + " ")
		}
		text := sb.String()
		l := w.k.NewLoose("bob", nil)
		var client []byte
		var hit *Hit
		for i := 0; i < len(text) && hit == nil; {
			j := min(len(text), i+1+rnd.Intn(9)) // ASCII and whole CJK runs: see parts
			for j < len(text) && text[j]&0xC0 == 0x80 {
				j++
			}
			var o []byte
			if rnd.Intn(2) == 0 {
				o, hit = l.Feed(nil, []byte(text[i:j]))
			} else {
				o, hit = l.FeedAll(nil, []byte(text[i:j]))
			}
			client = append(client, o...)
			i = j
		}
		if hit == nil {
			var o []byte
			o, hit = l.Flush(nil)
			client = append(client, o...)
		}
		switch {
		case planted && hit == nil:
			t.Fatalf("marker in escapes not found in %q", text)
		case !planted && hit != nil:
			t.Fatalf("hit %v on marker-free %q", hit, text)
		case !planted && string(client) != text:
			t.Fatalf("client saw %q of %q", client, text)
		case planted && !prefixUpToRedacted(text, client):
			t.Fatalf("client saw %q, not a prefix of %q (up to Redacted)", client, text)
		}
	}
}
