package sse

import (
	"bytes"
	"testing"
)

// collect feeds b in the pieces cuts gives, copying each piece and scribbling over it after
// Write (the parser must not keep the caller's buffer), and returns every event, End included.
func collect(b []byte, cuts []int, max int) (evs []Event, err error) {
	p := NewParser(max)
	prev := 0
	for _, c := range append(cuts, len(b)) {
		piece := append([]byte(nil), b[prev:c]...)
		prev = c
		p.Write(piece)
		for i := range piece {
			piece[i] = '#'
		}
		for {
			ev, ok, err := p.Next()
			if err != nil {
				return evs, err
			}
			if !ok {
				break
			}
			ev.Data = append([]byte(nil), ev.Data...)
			evs = append(evs, ev)
		}
	}
	if ev, ok := p.End(); ok {
		evs = append(evs, ev)
	}
	return evs, nil
}

// FuzzParser: engine bytes, cut anywhere into reads, give the same events as the same bytes in
// one read; with a small limit every event stays within it (or the stream is an error); no
// input panics.
func FuzzParser(f *testing.F) {
	for _, s := range []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: delta\r\nid: 7\r\ndata: x\r\ndata: y\r\n\r\n",
		"data: a\rdata: b\r\r",
		"\xEF\xBB\xBFdata: bom\n\n",
		": comment\nretry: 10\nid: a\x00b\ndata\n\n",
		"data:no space\n\ndata:  two spaces\n\n",
		"data: unterminated",
		"data: x\r",
		"\r\n\r\n\n\r",
		"event: only a name\n\n",
	} {
		f.Add([]byte(s), uint64(0x9e3779b97f4a7c15))
		f.Add([]byte(s), uint64(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cutSeed uint64) {
		if len(b) > 1<<16 {
			return
		}
		var cuts []int
		x := cutSeed
		for n := int(x % 9); n > 0 && len(b) > 0; n-- {
			x = x*6364136223846793005 + 1442695040888963407
			cuts = append(cuts, int(x>>33)%(len(b)+1))
		}
		for i := 1; i < len(cuts); i++ { // insertion sort: at most 8
			for j := i; j > 0 && cuts[j] < cuts[j-1]; j-- {
				cuts[j], cuts[j-1] = cuts[j-1], cuts[j]
			}
		}
		whole, werr := collect(b, nil, 1<<20)
		split, serr := collect(b, cuts, 1<<20)
		if (werr != nil) != (serr != nil) || len(whole) != len(split) {
			t.Fatalf("%q cut at %v: %d events (err %v) vs %d whole (err %v)", b, cuts, len(split), serr, len(whole), werr)
		}
		for i := range whole {
			if whole[i].Name != split[i].Name || whole[i].ID != split[i].ID || !bytes.Equal(whole[i].Data, split[i].Data) {
				t.Fatalf("%q cut at %v: event %d %+v vs whole %+v", b, cuts, i, split[i], whole[i])
			}
		}
		const small = 64
		evs, _ := collect(b, cuts, small)
		for _, ev := range evs[:max(0, len(evs)-1)] { // End's last event is bounded by the last Next
			if len(ev.Data) > small {
				t.Fatalf("%q: an event of %d bytes passed a %d-byte limit", b, len(ev.Data), small)
			}
		}
	})
}
