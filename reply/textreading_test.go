package reply

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/request"
)

// recDetector records what each prompt-text reading the guard opens is fed.
type recDetector struct{ reads []*recReading }

type recReading struct {
	d *recDetector
	b strings.Builder
}

func (d *recDetector) Echo(canary.Hit) {}

func (d *recDetector) Reading() TextReading {
	r := &recReading{d: d}
	d.reads = append(d.reads, r)
	return r
}

func (r *recReading) Feed(s string) *canary.Hit { r.b.WriteString(s); return nil }

func (r *recReading) Fork() TextReading {
	c := &recReading{d: r.d}
	c.b.WriteString(r.b.String())
	r.d.reads = append(r.d.reads, c)
	return c
}

func (d *recDetector) texts() []string {
	var out []string
	for _, r := range d.reads {
		out = append(out, r.b.String())
	}
	slices.Sort(out)
	return out
}

// In a stream the prompt-text detector reads each text field per choice and item as an SDK
// assembles it, and the joined text in emission order; with one text field the two are one
// reading (the text is hashed once).
func TestTextReadingsPerFieldAndJoined(t *testing.T) {
	chat := func(idx, field, text string) string {
		return `data: {"object":"chat.completion.chunk","choices":[{"index":` + idx + `,"delta":{"` + field + `":"` + text + `"}}]}` + "\n\n"
	}
	tool := func(idx, args string) string {
		return `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":` + idx + `,"function":{"arguments":"` + args + `"}}]}}]}` + "\n\n"
	}
	resp := func(item, text string) string {
		return "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":" + item + ",\"content_index\":0,\"delta\":\"" + text + "\"}\n\n"
	}
	block := func(idx, text string) string {
		return "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":" + idx + ",\"delta\":{\"type\":\"text_delta\",\"text\":\"" + text + "\"}}\n\n"
	}
	for _, c := range []struct {
		name   string
		kind   request.Kind
		events []string
		want   []string
	}{
		{"one field: one reading", request.Chat, []string{chat("0", "content", "Hello "), chat("0", "content", "big "), chat("0", "content", "world")},
			[]string{"Hello big world"}},
		{"n=2 interleaved", request.Chat, []string{chat("0", "content", "a1 "), chat("1", "content", "b1 "), chat("0", "content", "a2 "), chat("1", "content", "b2")},
			[]string{"a1 a2 ", "a1 b1 a2 b2", "b1 b2"}},
		{"content and reasoning", request.Chat, []string{chat("0", "reasoning_content", "r1 "), chat("0", "content", "c1 "), chat("0", "reasoning_content", "r2")},
			[]string{"c1 ", "r1 c1 r2", "r1 r2"}},
		{"two tool calls' arguments", request.Chat, []string{tool("0", "x1"), tool("1", "y1"), tool("0", "x2")},
			[]string{"x1x2", "x1y1x2", "y1"}},
		{"responses output items", request.Responses, []string{resp("0", "i1 "), resp("1", "j1 "), resp("0", "i2")},
			[]string{"i1 i2", "i1 j1 i2", "j1 "}},
		{"output items far apart", request.Responses, []string{resp("0", "i1 "), resp("2097152", "j1 "), resp("0", "i2")},
			[]string{"i1 i2", "i1 j1 i2", "j1 "}},
		{"anthropic blocks", request.Messages, []string{block("0", "p1 "), block("1", "q1 "), block("0", "p2")},
			[]string{"p1 p2", "p1 q1 p2", "q1 "}},
	} {
		sc, _ := testScope(t, c.kind)
		d := &recDetector{}
		sc.Watch = d
		s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, Sink: funcSink{leak: func() { t.Errorf("%s: leak", c.name) }},
			FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n")})
		s.Write([]byte(strings.Join(c.events, "")))
		s.End()
		if got := d.texts(); !slices.Equal(got, c.want) {
			t.Errorf("%s: readings %q, want %q", c.name, got, c.want)
		}
	}
}
