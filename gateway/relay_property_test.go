package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/canary"
)

// The whole relay path, driven with random streams: a foreign marker planted in a random
// disguise, split at random points across random fields' events, framed at random (LF, CRLF, CR,
// comments, ids, multi-line data), compressed or not, written in random pieces. Every run must end
// in a cut with the leak recorded and leave no fragment a decoding client could find; the same
// streams without the marker must arrive whole.
func TestRelayPropertyRandomStreams(t *testing.T) {
	rig := newHostileRig(t, "")
	rng := rand.New(rand.NewSource(12))
	disguise := []func(string) string{
		func(m string) string { return m },
		func(m string) string { return m[len(canary.MarkerPrefix):] },
		strings.ToUpper,
		mixed,
		zeroWidth,
	}
	framings := []string{"\n", "\r\n", "\r"}
	const runs = 120
	for i := 0; i < runs; i++ {
		planted := i%4 != 3 // every fourth stream carries no marker
		m := disguise[rng.Intn(len(disguise))](rig.victim)
		words := []string{"The", " answer", " is", " here", ":", " "}
		if planted {
			// Split the marker into 1–4 pieces at random points.
			cuts := []int{0}
			for k := rng.Intn(4); k > 0; k-- {
				c := 1 + rng.Intn(len(m)-1)
				for !utf8.RuneStart(m[c]) {
					c-- // deltas carry whole characters: a JSON string is text
				}
				cuts = append(cuts, c)
			}
			cuts = append(cuts, len(m))
			sortInts(cuts)
			for j := 1; j < len(cuts); j++ {
				if cuts[j] > cuts[j-1] {
					words = append(words, m[cuts[j-1]:cuts[j]])
				}
			}
		}
		words = append(words, " and", " more.")
		field := []string{"content", "reasoning_content", "tool"}[rng.Intn(3)]
		nl := framings[rng.Intn(len(framings))]
		var raw strings.Builder
		for j, w := range words {
			if rng.Intn(3) == 0 {
				raw.WriteString(": keep-alive" + nl)
			}
			if rng.Intn(3) == 0 {
				fmt.Fprintf(&raw, "id: %d%s", j, nl)
			}
			data := eventFor(field, w, rng.Intn(2) == 0)
			if rng.Intn(3) == 0 {
				// The same JSON over two data lines (joined with a newline: whitespace to JSON).
				cut := strings.IndexByte(data, ',')
				if cut > 0 {
					data = data[:cut+1] + "\n" + data[cut+1:]
				}
			}
			for _, line := range strings.Split(data, "\n") {
				raw.WriteString("data: " + line + nl)
			}
			raw.WriteString(nl)
		}
		raw.WriteString("data: [DONE]" + nl + nl)
		payload := []byte(raw.String())
		encoding := []string{"", "gzip", "deflate"}[rng.Intn(3)]
		switch encoding {
		case "gzip":
			payload = gz(raw.String())
		case "deflate":
			payload = deflated(raw.String())
		}
		piece := 1 + rng.Intn(64)
		rig.set(func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("text/event-stream")
			if encoding != "" {
				ctx.Response.Header.Set("Content-Encoding", encoding)
			}
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for k := 0; k < len(payload); k += piece {
					_, _ = w.Write(payload[k:min(k+piece, len(payload))])
					if w.Flush() != nil {
						return
					}
				}
			})
		})
		before := rig.leaks()
		status, h, body := rig.ask(true)
		desc := fmt.Sprintf("run %d (field %s, framing %q, encoding %q, pieces of %d, planted %v)", i, field, nl, encoding, piece, planted)
		if status != 200 {
			t.Fatalf("%s: status %d %s", desc, status, body)
		}
		if n := fragment(clientView(h, body), rig.victim); n >= canary.FragmentMin {
			t.Fatalf("%s: %d marker characters reached the client: %q", desc, n, body)
		}
		cut := strings.Contains(string(body), "upstream_integrity")
		if planted {
			if !cut {
				t.Fatalf("%s: not cut: %q", desc, body)
			}
			waitFor(t, func() bool { return rig.leaks() > before }, desc+": leak not recorded")
			rig.release()
			continue
		}
		if cut || accumulated(t, body, field) != strings.Join(words, "") {
			t.Fatalf("%s: a clean stream changed: %q", desc, body)
		}
	}
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// eventFor is one chat chunk carrying w in field (tool: tool-call arguments), written with JSON
// escapes for every character when escape is set.
func eventFor(field, w string, escape bool) string {
	val := `"` + strings.ReplaceAll(strings.ReplaceAll(w, `\`, `\\`), `"`, `\"`) + `"`
	if escape {
		val = `"` + escapeAll(w) + `"`
	}
	if field == "tool" {
		return `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":` + val + `}}]}}]}`
	}
	return `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"` + field + `":` + val + `}}]}`
}

// accumulated joins a stream's field as a client accumulates deltas.
func accumulated(t *testing.T, body []byte, field string) string {
	var b strings.Builder
	for _, ev := range strings.Split(string(body), "\n\n") {
		d, ok := strings.CutPrefix(ev, "data: ")
		if !ok || d == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta map[string]json.RawMessage `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("event %q: %v", d, err)
		}
		for _, ch := range c.Choices {
			if field == "tool" {
				var tc []struct {
					Function struct{ Arguments string } `json:"function"`
				}
				_ = json.Unmarshal(ch.Delta["tool_calls"], &tc)
				for _, x := range tc {
					b.WriteString(x.Function.Arguments)
				}
				continue
			}
			var s string
			_ = json.Unmarshal(ch.Delta[field], &s)
			b.WriteString(s)
		}
	}
	return b.String()
}

func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
