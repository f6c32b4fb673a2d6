package canary

import (
	"bytes"
	"testing"
)

// FuzzScanner: any text, cut into events anywhere, never emits "KVG-", and emits exactly what the
// same text scanned in one piece emits (the verdicts agree too).
func FuzzScanner(f *testing.F) {
	w := newWorld(f, "alice", "bob", "carol")
	own, bob, carol := w.cur["alice"], w.cur["bob"], w.cur["carol"]
	echoes := []string{carol}
	for _, s := range []string{
		"", "hello", "KVG-", "KVG", "KVKVG-", own, bob, carol, bob[:12], own[:13] + "x",
		"K" + own + "V" + own + "G-", "KV" + own + "G-" + bob, "中文KVG-ab😀", "KVG-" + own,
		"x " + carol + " y " + own + bob[:4+8],
	} {
		f.Add([]byte(s), uint64(0x9e3779b97f4a7c15))
		f.Add([]byte(s), uint64(1))
	}
	f.Fuzz(func(t *testing.T, text []byte, cutSeed uint64) {
		whole, wv := w.k.ScanAll("alice", echoes, text)
		if bytes.Contains(whole, prefixBytes) {
			t.Fatalf("ScanAll(%q) emitted KVG-: %q", text, whole)
		}
		// Cut points from the seed (a simple LCG): between 0 and 8 cuts.
		var cuts []int
		x := cutSeed
		for n := int(x % 9); n > 0 && len(text) > 0; n-- {
			x = x*6364136223846793005 + 1442695040888963407
			cuts = append(cuts, int(x>>33)%(len(text)+1))
		}
		sortInts(cuts)
		out, leak, _, _ := stream(w.k, "alice", echoes, text, cuts)
		if bytes.Contains(out, prefixBytes) {
			t.Fatalf("%q cut at %v emitted KVG-: %q", text, cuts, out)
		}
		if !bytes.Equal(out, whole) || (leak != nil) != (wv.Leak != nil) {
			t.Fatalf("%q cut at %v: %q (leak %v), whole: %q (leak %v)", text, cuts, out, leak != nil, whole, wv.Leak != nil)
		}
		if !bytes.Contains(text, prefixBytes) && !bytes.Equal(out, text) {
			t.Fatalf("text without KVG- changed: %q → %q", text, out)
		}
	})
}
