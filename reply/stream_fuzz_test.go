package reply

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tests/markerhour"
)

// FuzzEventRelay drives the stream relay with arbitrary engine bytes, a foreign marker planted
// (in one of several disguises) at an arbitrary offset, fed in arbitrary pieces. Whatever the
// bytes, the client's stream is well formed (each event one data line of JSON or [DONE]) and
// no fragment of the marker that a client could decode reaches it.
func FuzzEventRelay(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi \"}}]}\n\ndata: [DONE]\n\n"), uint16(40), uint8(1), uint8(7))
	f.Add([]byte("data: {\"a\":\"\"}\r\rdata: [DONE]\r\r"), uint16(11), uint8(3), uint8(1))
	f.Add([]byte(": c\nid: 1\nevent: e\ndata: {\"text\":\"\",\ndata: \"x\":1}\n\n"), uint16(43), uint8(5), uint8(3))
	f.Add([]byte("data: [\"\", \"\"]\n\n"), uint16(8), uint8(7), uint8(2))
	kr := markerhour.Keyring("s", "alice", "bob") // the pinned hour's markers
	victim, _ := kr.Current("bob", time.Now())
	disguises := []func(string) string{
		func(m string) string { return m },
		func(m string) string { return m[len(canary.MarkerPrefix):] },
		strings.ToUpper,
		func(m string) string { return strings.Join(strings.Split(m, ""), "\u200b") },
		func(m string) string { return strings.Join(strings.Split(m, ""), `\u200b`) }, // JSON escapes
	}
	f.Fuzz(func(t *testing.T, raw []byte, at uint16, plant uint8, piece uint8) {
		if len(raw) > 1<<14 {
			return
		}
		if plant%2 == 1 {
			p := int(at) % (len(raw) + 1)
			m := disguises[int(plant/2)%len(disguises)](victim)
			raw = append(raw[:p:p], append([]byte(m), raw[p:]...)...)
		}
		e := NewStream(StreamOptions{Guard: NewGuard(Scope{Keyring: kr, Requester: "alice", Kind: request.Chat}), MaxEventBytes: 1 << 20,
			FailEvent: []byte("data: {\"error\":{}}\n\ndata: [DONE]\n\n"), CutEvent: []byte("data: {\"error\":{}}\n\ndata: [DONE]\n\n")})
		n := 1 + int(piece)%32
		for i := 0; i < len(raw) && !e.Ended(); i += n {
			e.Write(raw[i:min(i+n, len(raw))])
		}
		e.End()
		var view strings.Builder
		for _, ev := range strings.SplitAfter(string(e.Pending()), "\n\n") {
			if ev == "" {
				continue
			}
			ev = strings.TrimSuffix(ev, "\n\n")
			if name, rest, ok := strings.Cut(ev, "\n"); ok && strings.HasPrefix(name, "event: ") {
				view.WriteString(name + "\n")
				ev = rest
			}
			data, ok := strings.CutPrefix(ev, "data: ")
			if !ok || strings.Contains(data, "\n") {
				t.Fatalf("malformed client event %q in %q", ev, e.Pending())
			}
			if data == "[DONE]" {
				continue
			}
			v, _, err := DecodeStrict([]byte(data))
			if err != nil {
				t.Fatalf("client event is not JSON: %q", data)
			}
			collectStrings(v, &view)
		}
		view.Write(e.Pending())
		if frag := foldedFragment(view.String(), victim); frag >= canary.FragmentMin {
			t.Fatalf("%d characters of the marker reached the client: %q", frag, e.Pending())
		}
	})
}

func collectStrings(v any, b *strings.Builder) {
	switch t := v.(type) {
	case string:
		b.WriteString(t)
	case map[string]any:
		for k, e := range t {
			b.WriteString(k)
			collectStrings(e, b)
		}
	case []any:
		if s, ok := byteArray(t); ok {
			b.WriteString(s)
		}
		for _, e := range t {
			collectStrings(e, b)
		}
	}
}

// foldedFragment is the longest start of the marker's characters in s, as a reader sees s.
func foldedFragment(s, marker string) int {
	var f bytes.Buffer
	for _, r := range s {
		if unicode.In(r, unicode.Cf, unicode.Mn, unicode.Me) {
			continue
		}
		f.WriteRune(unicode.ToLower(r))
	}
	body := marker[len(canary.MarkerPrefix):]
	for n := len(body); n > 0; n-- {
		if bytes.Contains(f.Bytes(), []byte(body[:n])) {
			return n
		}
	}
	return 0
}
