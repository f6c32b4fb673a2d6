package canary

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// The fast path (scanFast, wideRun: two characters a turn, the filter probed one way at even run
// lengths) must be invisible: on any text, cut anywhere, a detector that sends every character
// through the slow path (step, probe: the exact check) emits the same bytes, reports the same
// hit and tells FindMarkerFragments' collector the same stretches.

// fastAgreeText builds a text of random pieces around live markers' windows (5 to 12
// characters from any offset, either way, in the disguises the folding reads, with separators,
// breaks and undecodable bytes around and inside them).
func fastAgreeText(rnd *rand.Rand, bodies []string) string {
	var sb strings.Builder
	for n := 4 + rnd.Intn(24); n > 0; n-- {
		switch rnd.Intn(10) {
		case 0, 1, 2:
			body := bodies[rnd.Intn(len(bodies))]
			ln := 5 + rnd.Intn(8)
			off := rnd.Intn(MarkerChars - ln + 1)
			w := []byte(body[off : off+ln])
			if rnd.Intn(2) == 0 {
				for i, j := 0, len(w)-1; i < j; i, j = i+1, j-1 {
					w[i], w[j] = w[j], w[i]
				}
			}
			for _, c := range w {
				sb.WriteString(fastAgreeChar(rnd, c))
				if rnd.Intn(4) == 0 {
					sb.WriteString([]string{" ", "-", ".", "\u200b", "\u00ad", "\u0301", "_"}[rnd.Intn(7)])
				}
			}
		case 3:
			for k := rnd.Intn(12); k > 0; k-- {
				sb.WriteByte("abcdefghijklmnopqrstuvwxyz234567 IlO01"[rnd.Intn(38)])
			}
		case 4:
			sb.WriteString([]string{" ", ", ", "(", "!", "\n", "。", "大型", "😀", "8", "9"}[rnd.Intn(10)])
		case 5:
			sb.WriteString([]string{"中文模型", "键值缓存", "，", "Ж", "é", "\u2028"}[rnd.Intn(6)])
		case 6:
			// Undecodable or cut UTF-8: a stray continuation, an overlong 'a' and soft hyphen (a
			// separator if it were decoded), a surrogate, a 3-byte lead without its tail, a
			// 2-byte overlong.
			sb.WriteString([]string{"\x80", "\xe0\x81\xa1", "\xe0\x82\xad", "\xed\xa0\x80", "\xe4\xb8", "\xc1\xa1", "\xff"}[rnd.Intn(7)])
		case 7:
			sb.WriteString([]string{"&#107;", "\\u006b", "&amp;", "&#x41;", "\\ud835\\udc1a", "&", "\\"}[rnd.Intn(7)])
		case 8:
			sb.WriteString("The quick brown fox jumps over the lazy dog ")
		case 9:
			sb.WriteString("ａｂｃ𝐚𝐛ⓐⓑ")
		}
	}
	return sb.String()
}

// fastAgreeChar writes a marker character as text might: as is, upper case, or a character of
// its class (i, l, I, 1; o, 0), fullwidth, or a look-alike.
func fastAgreeChar(rnd *rand.Rand, c byte) string {
	switch rnd.Intn(8) {
	case 0:
		return strings.ToUpper(string(c))
	case 1:
		switch c {
		case 'i', 'l':
			return []string{"I", "1", "l", "i", "|"}[rnd.Intn(5)]
		case 'o':
			return "0"
		}
	case 2:
		if c >= 'a' && c <= 'z' {
			return string(rune(0xFF41 + rune(c-'a'))) // fullwidth
		}
	case 3:
		if c == 'a' {
			return "\u0430" // Cyrillic a
		}
	}
	return string(c)
}

// fastAgreeRun feeds text (cut at cuts) to a detector for tenant, by Feed and Flush as a field's
// detector is fed, or by FeedAll only as the joined reading of values is, and returns everything
// observable.
func fastAgreeRun(k *Keyring, tenant string, echoes []string, text string, cuts []int, all bool, slowOnly bool) string {
	l := k.NewLoose(tenant, echoes)
	l.slowOnly = slowOnly
	var out []byte
	var hit *Hit
	prev := 0
	for _, c := range append(cuts, len(text)) {
		if hit != nil {
			break
		}
		if all {
			out, hit = l.FeedAll(out, []byte(text[prev:c]))
		} else {
			out, hit = l.Feed(out, []byte(text[prev:c]))
		}
		prev = c
	}
	if hit == nil && !all {
		out, hit = l.Flush(out)
	}
	var col strings.Builder
	c := &Loose{k: k, tenant: "\x00", slowOnly: slowOnly}
	c.collect = func(rec, lo, n int) { fmt.Fprintf(&col, "%d:%d+%d ", rec, lo, n) }
	c.feed(nil, []byte(text), true, false)
	return fmt.Sprintf("out %q\nhit %+v\ncollect %s", out, hit, col.String())
}

func fastAgreeCuts(rnd *rand.Rand, n int) []int {
	var cuts []int
	for c := rnd.Intn(6); c > 0 && n > 0; c-- {
		cuts = append(cuts, rnd.Intn(n+1))
	}
	sortInts(cuts)
	return cuts
}

func TestLooseFastPathAgreesWithSlowPath(t *testing.T) {
	tenants := []string{"alice", "bob"}
	for i := 0; i < 60; i++ {
		tenants = append(tenants, fmt.Sprintf("t%02d", i))
	}
	w := newWorld(t, tenants...)
	w.k.AddTenant("late") // a delta set beside the base: the fast path probes both
	late, _ := w.k.Current("late", w.now)
	var bodies []string
	for m := range w.live {
		bodies = append(bodies, m[len(MarkerPrefix):])
	}
	bodies = append(bodies, late[len(MarkerPrefix):])
	sortStrings(bodies)
	rnd := rand.New(rand.NewSource(17))
	diverse := map[string]bool{}
	for it := 0; it < 4000; it++ {
		text := fastAgreeText(rnd, bodies)
		cuts := fastAgreeCuts(rnd, len(text))
		all := rnd.Intn(3) == 0
		var echoes []string
		if rnd.Intn(4) == 0 {
			echoes = w.k.FindMarkerFragments(fastAgreeText(rnd, bodies))
		}
		tenant := []string{"bob", "alice", "late", "nobody"}[rnd.Intn(4)]
		fast := fastAgreeRun(w.k, tenant, echoes, text, cuts, all, false)
		slow := fastAgreeRun(w.k, tenant, echoes, text, cuts, all, true)
		if fast != slow {
			t.Fatalf("text %q cut at %v (FeedAll %v), tenant %s:\nfast path:\n%s\nslow path only:\n%s", text, cuts, all, tenant, fast, slow)
		}
		switch {
		case strings.Contains(fast, "hit <nil>") && strings.Contains(fast, Redacted):
			diverse["withheld"] = true
		case !strings.Contains(fast, "hit <nil>"):
			diverse["hit"] = true
		default:
			diverse["clean"] = true
		}
	}
	// The texts must exercise what the fast path hands over: withheld runs, hits, clean text.
	for _, k := range []string{"withheld", "hit", "clean"} {
		if !diverse[k] {
			t.Errorf("no text ended %s: the generator does not reach the slow path's cases", k)
		}
	}
}

// FuzzLooseFastPath: the same agreement on any text and cuts.
func FuzzLooseFastPath(f *testing.F) {
	w := newWorld(f, "alice", "bob")
	victim := w.cur["alice"][len(MarkerPrefix):]
	rev := []byte(victim)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	for _, s := range []string{"", "hello world", victim, string(rev), strings.ToUpper(victim[3:12]), "x" + victim[:8] + ",",
		"a b " + victim[5:14], "中文" + victim[:9] + "模型", "\xed\xa0\x80" + victim[2:10], "&#107;" + victim} {
		f.Add(s, uint64(0))
		f.Add(s, uint64(0x9e3779b97f4a7c15))
		f.Add(s, uint64(3))
	}
	f.Fuzz(func(t *testing.T, text string, seed uint64) {
		if len(text) > 1<<12 {
			return
		}
		rnd := rand.New(rand.NewSource(int64(seed)))
		cuts := fastAgreeCuts(rnd, len(text))
		all := seed&1 != 0
		fast := fastAgreeRun(w.k, "bob", nil, text, cuts, all, false)
		slow := fastAgreeRun(w.k, "bob", nil, text, cuts, all, true)
		if fast != slow {
			t.Fatalf("text %q cut at %v (FeedAll %v):\nfast path:\n%s\nslow path only:\n%s", text, cuts, all, fast, slow)
		}
	})
}
