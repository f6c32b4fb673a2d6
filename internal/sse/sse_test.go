package sse

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// parseAll feeds s in pieces of n bytes and collects every event, End included.
func parseAll(t *testing.T, s string, n, max int) ([]Event, error) {
	t.Helper()
	p := NewParser(max)
	var out []Event
	for i := 0; i < len(s); i += n {
		p.Write([]byte(s[i:min(i+n, len(s))]))
		for {
			ev, ok, err := p.Next()
			if err != nil {
				return out, err
			}
			if !ok {
				break
			}
			ev.Data = append([]byte(nil), ev.Data...) // the parser reuses its buffer
			out = append(out, ev)
		}
	}
	if ev, ok := p.End(); ok {
		out = append(out, ev)
	}
	return out, nil
}

func TestFramings(t *testing.T) {
	want := []Event{{Name: "delta", ID: "7", Data: []byte("{\"a\":\n1}")}, {Data: []byte("[DONE]")}}
	streams := map[string]string{
		"LF":            "event: delta\nid: 7\ndata: {\"a\":\ndata: 1}\n\ndata: [DONE]\n\n",
		"CRLF":          "event: delta\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata: [DONE]\r\n\r\n",
		"CR":            "event: delta\rid: 7\rdata: {\"a\":\rdata: 1}\r\rdata: [DONE]\r\r",
		"mixed":         "event: delta\r\nid: 7\rdata: {\"a\":\ndata: 1}\r\n\ndata: [DONE]\r\r\n",
		"comments":      ": keep-alive\nevent: delta\n: note\nid: 7\ndata: {\"a\":\ndata: 1}\n\n:x\n\ndata: [DONE]\n\n",
		"no space":      "event:delta\nid:7\ndata:{\"a\":\ndata:1}\n\ndata:[DONE]\n\n",
		"BOM":           "\xEF\xBB\xBFevent: delta\nid: 7\ndata: {\"a\":\ndata: 1}\n\ndata: [DONE]\n\n",
		"retry/unknown": "retry: 10\nfoo: bar\nevent: delta\nid: 7\ndata: {\"a\":\ndata: 1}\n\ndata: [DONE]",
		"blank first":   "\n\n\nevent: delta\nid: 7\ndata: {\"a\":\ndata: 1}\n\ndata: [DONE]\n",
	}
	for name, s := range streams {
		for _, n := range []int{1, 2, 3, 5, len(s)} {
			got, err := parseAll(t, s, n, 1<<20)
			if err != nil {
				t.Fatalf("%s/%d: %v", name, n, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s/%d: got %q", name, n, got)
			}
		}
	}
}

// An event with no data line is never dispatched; a bare "data" line is an empty data line.
func TestNoDataAndBareField(t *testing.T) {
	got, _ := parseAll(t, "event: ping\n\ndata\ndata\n\n", 1, 100)
	if len(got) != 1 || string(got[0].Data) != "\n" {
		t.Fatalf("got %q", got)
	}
}

func TestEventCap(t *testing.T) {
	// One endless line, and many lines of one event: both stop at the cap.
	for _, s := range []string{"data: " + strings.Repeat("x", 5000), strings.Repeat("data: xx\n", 1000)} {
		_, err := parseAll(t, s, 64, 1024)
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("err = %v", err)
		}
	}
	// Many small events pass however long the stream.
	got, err := parseAll(t, strings.Repeat("data: xx\n\n", 1000), 64, 1024)
	if err != nil || len(got) != 1000 {
		t.Fatalf("%d events, %v", len(got), err)
	}
}

// The parser's work is linear: a long event in 1-byte writes finishes quickly because each byte
// is searched once (checked by the bytes it buffers, not by time).
func TestNoRescan(t *testing.T) {
	p := NewParser(1 << 20)
	line := bytes.Repeat([]byte("y"), 100000)
	for _, c := range line {
		p.Write([]byte{c})
		if _, ok, err := p.Next(); ok || err != nil {
			t.Fatal("unexpected event")
		}
	}
	if p.scanned != len(line) {
		t.Fatalf("scanned %d of %d", p.scanned, len(line))
	}
}
