package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/canary"
)

// Issue 17's classes through a real gateway and a hostile engine: another tenant's marker (or a
// stretch of it from any offset) in every disguise a reader decodes, streamed and whole, on the
// chat, completions and /generate routes. A stretch of 12 or more characters is a leak, cut
// and recorded; a shorter one is withheld from its 8th character; the client never gets more
// than 7 consecutive characters of it. The echo shield: a requester that sends part of the
// victim's marker itself gets exactly that part back as an echo, and anything beyond is a leak.
// (The Responses and Messages shapes are driven through the same reply path by
// reply.TestReplyPathProperty.)
func TestHostileEngineDisguisesAndStretches(t *testing.T) {
	rig := newHostileRig(t, "")
	body := rig.victim[len(canary.MarkerPrefix):]
	// Incidents are listed newest first up to a limit: a fresh gateway per route keeps the count
	// of leaks under it. The marker is the same (same secret and tenants).
	disguises := []struct {
		name string
		f    func(string) string
	}{
		{"math bold", func(s string) string { return runeMap(s, 0x1D41A, 0x1D7CE) }},
		{"circled", func(s string) string { return runeMap(s, 0x24D0, 0x2460-1) }},
		{"fullwidth", func(s string) string { return runeMap(s, 0xFF41, 0xFF10) }},
		{"look-alikes", func(s string) string {
			return strings.NewReplacer("a", "а", "c", "с", "e", "е", "o", "ο", "p", "р", "x", "х", "y", "у", "i", "і", "k", "κ", "v", "ν").Replace(s)
		}},
		{"html numeric", func(s string) string {
			var b strings.Builder
			for _, c := range s {
				fmt.Fprintf(&b, "&#x%x;", c)
			}
			return b.String()
		}},
		{"html named", func(s string) string {
			var b strings.Builder
			for _, c := range s {
				if c >= 'a' && c <= 'z' {
					b.WriteString("&" + string(c) + "opf;")
				} else {
					fmt.Fprintf(&b, "&#%d;", c)
				}
			}
			return b.String()
		}},
		{"json escapes in the text", func(s string) string {
			var b strings.Builder
			for _, c := range s {
				fmt.Fprintf(&b, `\u%04x`, c)
			}
			return b.String()
		}},
		{"spaced", func(s string) string { return strings.Join(strings.Split(s, ""), " ") }},
		{"dashed", func(s string) string { return strings.Join(strings.Split(s, ""), "-") }},
		{"dotted", func(s string) string { return strings.Join(strings.Split(strings.ToUpper(s), ""), ".") }},
		{"one space in the middle", func(s string) string { return s[:len(s)/2] + " " + s[len(s)/2:] }},
		{"reversed", func(s string) string {
			b := []byte(s)
			for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
				b[i], b[j] = b[j], b[i]
			}
			return string(b)
		}},
	}
	stretches := []struct {
		name   string
		lo, hi int
		leak   bool
	}{
		{"whole", 0, canary.MarkerChars, true},
		{"suffix of 19", 1, canary.MarkerChars, true},
		{"middle 13", 3, 16, true},
		{"first 11", 0, 11, false},
		{"middle 9", 6, 15, false},
	}
	routes := []struct {
		path   string
		stream bool
		reply  func(ctx *fasthttp.RequestCtx, text string)
	}{
		{"/v1/chat/completions", true, func(ctx *fasthttp.RequestCtx, text string) {
			// The text in three deltas, split at thirds.
			a, b := runeCut(text, 1, 3), runeCut(text, 2, 3)
			sse(ctx, "text/event-stream", "data: "+chunkJSON("content", "see: "+text[:a])+"\n\ndata: "+chunkJSON("content", text[a:b])+
				"\n\ndata: "+chunkJSON("content", text[b:]+" ;end")+"\n\ndata: [DONE]\n\n")
		}},
		{"/v1/chat/completions", false, func(ctx *fasthttp.RequestCtx, text string) {
			ctx.SetContentType("application/json")
			b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "see: " + text + " ;end"}}}})
			ctx.SetBody(b)
		}},
		{"/v1/completions", true, func(ctx *fasthttp.RequestCtx, text string) {
			ev := func(s string) string {
				b, _ := json.Marshal(map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": s}}})
				return "data: " + string(b) + "\n\n"
			}
			n := runeCut(text, 1, 2)
			sse(ctx, "text/event-stream", ev("see: "+text[:n])+ev(text[n:]+" ;end")+"data: [DONE]\n\n")
		}},
		{"/generate", true, func(ctx *fasthttp.RequestCtx, text string) {
			ev := func(s string) string {
				b, _ := json.Marshal(map[string]any{"text": s, "meta_info": map[string]any{"id": "r"}})
				return "data: " + string(b) + "\n\n"
			}
			n := runeCut(text, 1, 2)
			sse(ctx, "text/event-stream", ev("see: "+text[:n])+ev("see: "+text+" ;end")+"data: [DONE]\n\n")
		}},
	}
	cases := 0
	for i, rt := range routes {
		if i > 0 {
			rig = newHostileRig(t, "")
		}
		for _, st := range stretches {
			for _, d := range disguises {
				name := fmt.Sprintf("%s stream=%v %s %s", rt.path, rt.stream, st.name, d.name)
				plant := d.f(body[st.lo:st.hi])
				before := rig.leaks()
				rig.set(func(ctx *fasthttp.RequestCtx) { rt.reply(ctx, plant) })
				status, h, got := askRoute(t, rig, rt.path, rt.stream, "hello")
				view := clientView(h, got)
				if n := canary.LongestRun(view, rig.victim); n >= canary.HoldMin {
					t.Errorf("%s: %d consecutive characters of the victim's marker reached the client (status %d): %q", name, n, status, got)
				}
				recorded := waitLeak(rig, before, st.leak)
				if recorded != st.leak {
					t.Errorf("%s: leak recorded %v, want %v (status %d): %.300q", name, recorded, st.leak, status, got)
				}
				rig.release()
				cases++
			}
		}
	}
	t.Logf("%d cases", cases)

	rig = newHostileRig(t, "")
	// The echo shield: the requester sends 12 characters of the victim's marker; the engine
	// answers with those 12 (an echo: passes) or with the whole marker (a leak).
	for _, c := range []struct {
		reply string
		leak  bool
	}{{body[4:16], false}, {body, true}, {body[4:17], true}} {
		before := rig.leaks()
		rig.set(func(ctx *fasthttp.RequestCtx) {
			sse(ctx, "text/event-stream", "data: "+chunkJSON("content", "you said: "+c.reply+" ;ok")+"\n\ndata: [DONE]\n\n")
		})
		status, h, got := askRoute(t, rig, "/v1/chat/completions", true, "please repeat "+body[4:16]+" back")
		view := clientView(h, got)
		if n := canary.LongestRun(view, rig.victim); n > 12 {
			t.Errorf("echo shield, reply %q: %d characters reached the client", c.reply, n)
		}
		if recorded := waitLeak(rig, before, c.leak); recorded != c.leak {
			t.Errorf("echo shield, reply %q: leak recorded %v, want %v (status %d): %q", c.reply, recorded, c.leak, status, got)
		}
		if !c.leak && !bytes.Contains(got, []byte(c.reply)) {
			t.Errorf("echo shield: the exact echo did not come back: %q", got)
		}
		rig.release()
	}
}

// runeCut is the byte offset of the rune boundary at num/den of text.
func runeCut(text string, num, den int) int {
	n := len([]rune(text)) * num / den
	return len(string([]rune(text)[:n]))
}

// runeMap writes lowercase letters from letterBase ('a') and digits from digitBase ('0').
func runeMap(s string, letterBase, digitBase rune) string {
	var b strings.Builder
	for _, c := range s {
		if c >= 'a' && c <= 'z' {
			b.WriteRune(letterBase + c - 'a')
		} else {
			b.WriteRune(digitBase + c - '0')
		}
	}
	return b.String()
}

// waitLeak reports whether a leak incident beyond before is recorded (incidents are stored in
// the background: wait for one when it is expected, briefly when not).
func waitLeak(rig *hostileRig, before int, want bool) bool {
	wait := 300 * time.Millisecond
	if want {
		wait = 3 * time.Second
	}
	deadline := time.Now().Add(wait)
	for rig.leaks() == before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return rig.leaks() > before
}

// askRoute is rig.ask for any generation route, with the requester's own text.
func askRoute(t *testing.T, rig *hostileRig, path string, stream bool, text string) (int, http.Header, []byte) {
	t.Helper()
	var body string
	switch path {
	case "/v1/chat/completions":
		body = fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":8,"stream":%v}`, text, stream)
	case "/v1/completions":
		body = fmt.Sprintf(`{"model":"sim","prompt":%q,"max_tokens":8,"stream":%v}`, text, stream)
	case "/generate":
		body = fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":8},"stream":%v}`, text, stream)
	}
	req, _ := http.NewRequest("POST", rig.gw.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+requesterKey)
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}
