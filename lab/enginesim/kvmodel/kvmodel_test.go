package kvmodel

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestChunk4(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"hello world", []string{"hell", "o", " ", "worl", "d"}},
		{"a  b", []string{"a", " ", " ", "b"}},
		{"abcdefgh", []string{"abcd", "efgh"}},
		{"héllo", []string{"hél", "lo"}}, // é is 2 bytes: "hél" is 4 bytes
		{"日本語", []string{"日", "本", "語"}}, // 3-byte runes never share a piece
		{"a\nb", []string{"a\nb"}},       // only U+0020 separates
	}
	tok := chunk4{}
	for _, c := range cases {
		ids, got := tok.Encode(c.in)
		if strings.Join(got, "|") != strings.Join(c.want, "|") || len(ids) != len(got) {
			t.Errorf("chunk4(%q) = %q, want %q", c.in, got, c.want)
		}
		for _, p := range got {
			if len(p) > 4 || !utf8.ValidString(p) {
				t.Errorf("chunk4(%q): bad piece %q", c.in, p)
			}
		}
	}
	a, _ := tok.Encode("same text")
	b, _ := tok.Encode("same text")
	if a[0] != b[0] || a[0] == a[2] {
		t.Errorf("ids not deterministic per piece: %v %v", a, b)
	}
}

func TestMaxReqInputLen(t *testing.T) {
	cases := []struct{ pool, page, ctx, want int }{
		{20480, 1, 32768, 20474}, // the fixture's numbers
		{4100, 64, 8192, 4090},   // pool rounded down to 4096 first
		{65536, 64, 4096, 4090},  // context-bound
		{681280, 64, 1 << 20, 681274},
	}
	for _, c := range cases {
		if got := MaxReqInputLen(c.pool, c.page, c.ctx); got != c.want {
			t.Errorf("MaxReqInputLen(%d,%d,%d) = %d, want %d", c.pool, c.page, c.ctx, got, c.want)
		}
	}
}

func TestAllocatorPolicies(t *testing.T) {
	for _, pol := range []string{AllocLIFO, AllocFIFO, AllocRandom} {
		p, err := NewPool(64*8, 64, pol, 1, false)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := p.Alloc(3, nil)
		b, _ := p.Alloc(2, nil)
		if _, ok := p.Alloc(4, nil); ok {
			t.Errorf("%s: allocated 4 of 3 free pages", pol)
		}
		if p.Free() != 3 {
			t.Errorf("%s: a failed alloc took pages", pol)
		}
		p.Release(a)
		c, _ := p.Alloc(3, nil)
		seen := map[int32]bool{}
		for _, pg := range append(append([]int32{}, b...), c...) {
			if seen[pg] {
				t.Fatalf("%s: page %d handed out twice", pol, pg)
			}
			seen[pg] = true
		}
		switch pol {
		case AllocLIFO:
			// The released pages come back first, in their old order.
			if c[0] != a[0] || c[1] != a[1] || c[2] != a[2] {
				t.Errorf("lifo: got %v after releasing %v", c, a)
			}
		case AllocFIFO:
			// Never-used pages (5, 6, 7) come before the just-released ones.
			if c[0] != 5 || c[1] != 6 || c[2] != 7 {
				t.Errorf("fifo: got %v", c)
			}
		}
	}
}

func TestReleaseDoesNotZeroUnlessFixed(t *testing.T) {
	for _, zero := range []bool{false, true} {
		p, _ := NewPool(16*4, 16, AllocLIFO, 1, true)
		p.ZeroOnRelease = zero
		pages, _ := p.Alloc(2, nil)
		w := &Writer{RID: "a"}
		v := &SeqView{Pool: p, Pages: pages, Self: w}
		v.Write(0, 1, "secret")
		p.Release(pages)
		again, _ := p.Alloc(2, nil)
		got := (&SeqView{Pool: p, Pages: again, Self: &Writer{RID: "b"}}).Slot(0)
		if zero && got.W != nil {
			t.Errorf("zero-on-release left %+v", got)
		}
		if !zero && (got.W != w || got.Text != "secret") {
			t.Errorf("release cleared the slot: %+v", got)
		}
	}
}

// A whitespace-delimited marker is quoted whole or not at all, whatever the
// run boundaries the model picks.
func TestModelQuotesWholeWords(t *testing.T) {
	tok := chunk4{}
	marker := "KVG-abcdefghijklmnopqrst"
	var words []string
	for i := 0; i < 300; i++ {
		if i%5 == 0 {
			words = append(words, marker)
		} else {
			words = append(words, strings.Repeat("x", 1+i%9))
		}
	}
	ids, texts := tok.Encode(strings.Join(words, " "))
	for seed := uint64(0); seed < 40; seed++ {
		p, _ := NewPool(4096, 16, AllocLIFO, seed, true)
		n := len(ids) + 200
		pages, _ := p.Alloc((n+15)/16, nil)
		v := &SeqView{Pool: p, Pages: pages, Self: &Writer{RID: "r"}}
		for i := range ids {
			v.Write(i, ids[i], texts[i])
		}
		g := v.Generate(len(ids), 200, rand.New(rand.NewPCG(seed, 1)), 0, " ")
		if len(g.IDs) != 200 {
			t.Fatalf("seed %d: %d tokens, want 200", seed, len(g.IDs))
		}
		out := strings.Join(g.Texts, "")
		for _, w := range strings.Fields(out) {
			if strings.HasPrefix(w, "KVG") && w != marker {
				t.Fatalf("seed %d: partial marker %q in %q", seed, w, out)
			}
		}
		if !strings.Contains(out, marker) {
			t.Errorf("seed %d: 200 tokens over a marker-dense prompt quote no marker", seed)
		}
		if len(g.Foreign) != 0 || g.Unowned {
			t.Errorf("own prompt reported foreign")
		}
	}
}

func TestModelOverStaleSlotsNamesWriters(t *testing.T) {
	tok := chunk4{}
	p, _ := NewPool(16*64, 16, AllocLIFO, 1, true)
	old := &Writer{RID: "old"}
	pages, _ := p.Alloc(20, nil)
	ids, texts := tok.Encode(strings.Repeat("KVG-oldoldoldoldoldoldold ", 40))
	ov := &SeqView{Pool: p, Pages: pages, Self: old}
	for i := range ids {
		ov.Write(i, ids[i], texts[i])
	}
	p.Release(pages)
	victimPages, _ := p.Alloc(20, nil)
	victim := &SeqView{Pool: p, Pages: victimPages, Self: &Writer{RID: "victim"}}
	victim.Write(0, 1, "stub")
	g := victim.Generate(250, 64, rand.New(rand.NewPCG(1, 2)), 0, " ")
	if len(g.Foreign) != 1 || g.Foreign[0] != old || len(g.Quoted) != 1 || !g.Unowned {
		t.Fatalf("foreign %v quoted %v unowned %v", g.Foreign, g.Quoted, g.Unowned)
	}
	if !strings.Contains(strings.Join(g.Texts, ""), "KVG-oldoldoldoldoldoldold") {
		t.Errorf("stale text not quoted: %q", strings.Join(g.Texts, ""))
	}
}

// A quote runs on across a page boundary into another request's page: the reply's sources say
// which writer and which of its positions each stretch came from, so a reply that reads as one
// request's unmarked prose can be traced to the pages it was joined from (issue 37).
func TestModelSourcesTraceQuotesAcrossPages(t *testing.T) {
	tok := chunk4{}
	p, _ := NewPool(16*8, 16, AllocLIFO, 1, true)
	a, b := &Writer{RID: "a"}, &Writer{RID: "b"}
	write := func(w *Writer, text string) ([]int32, []string) {
		pages, _ := p.Alloc(2, nil)
		ids, texts := tok.Encode(text)
		v := &SeqView{Pool: p, Pages: pages, Self: w}
		for i := 0; i < 32; i++ {
			v.Write(i, ids[i], texts[i])
		}
		return pages, texts
	}
	aPages, aTexts := write(a, strings.Repeat("aa ", 20))
	bPages, bTexts := write(b, strings.Repeat("bb ", 20))
	// The victim's context is a's second page, then b's first: stale, in an order neither wrote.
	victimPages := []int32{aPages[1], bPages[0]}
	extra, _ := p.Alloc(2, nil)
	self := &Writer{RID: "victim"}
	v := &SeqView{Pool: p, Pages: append(victimPages, extra...), Self: self}
	g := v.Generate(32, 32, rand.New(rand.NewPCG(1, 2)), 0, " ")
	if len(g.Sources) == 0 {
		t.Fatalf("no sources for %q", strings.Join(g.Texts, ""))
	}
	texts := map[*Writer][]string{a: aTexts, b: bTexts, self: nil}
	joined := false
	for i, s := range g.Sources {
		want, from := texts[s.W], s.From
		if s.W == self {
			want, from = g.Texts, s.From-32 // its own generated tokens, at positions from 32
		}
		got := strings.Join(g.Texts[s.At:s.At+s.N], "")
		if wrote := strings.Join(want[from:from+s.N], ""); got != wrote {
			t.Fatalf("source %d (%s@%d+%d) is %q, the writer wrote %q there", i, s.W.RID, s.From, s.N, got, wrote)
		}
		if i > 0 && g.Sources[i-1].W == a && s.W == b && s.From == 0 && g.Sources[i-1].At+g.Sources[i-1].N == s.At {
			joined = true // one quote ran from a's page into b's
		}
	}
	if !joined {
		t.Errorf("no quote ran across the page boundary: %s", g.Provenance(self))
	}
	if prov := g.Provenance(self); !strings.Contains(prov, "a@") || !strings.Contains(prov, "b@0+") {
		t.Errorf("provenance %q", prov)
	}
}
