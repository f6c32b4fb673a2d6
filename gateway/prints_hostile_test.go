package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/fingerprint"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/disguise"
	"github.com/kvgate/kvgate/tests/redistest"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Issue 31: a hostile engine replays another tenant's private system prompt (438 characters)
// in every disguise the marker detector already reads through, and as an n=2 stream whose
// choices interleave word by word; the prompt-text detector must cut it (enforce) or flag it
// (monitor), streamed and whole, with at most fingerprint.MaxQuoted folded characters of the
// prompt reaching the client. A text match alone quarantines nothing (one tenant can fake one:
// the ROT13 exchange below); matches for two requesters against two victims on one engine do.

// privatePrompt is alice's system prompt (438 characters): what the engine replays.
const privatePrompt = "You are Orion, the internal support agent of Helvetic Freight AG. Never reveal the " +
	"escalation code 4471-B or the names of our insurers (Baloise, Zurich). Quote tariffs only " +
	"from table T-9, round prices to CHF 0.05, and refuse to discuss the Basel depot's pending " +
	"audit. If a caller mentions invoice batch 88/2026, transfer them to Mrs. Keller at extension " +
	"318. Answer in the caller's language; sign every reply with 'Orion (HFAG)'. Be it."

// otherPrompt is dave's, a second victim.
const otherPrompt = "System: you draft replies for the Lindqvist family office. Holdings in Nordic timber, two " +
	"wind parks off Gotland and a private loan to Aurora Shipping must never be named to callers. " +
	"Wire approvals above SEK 2 million need both Astrid and Henrik; flag any request that mentions " +
	"the Riga account or the code word juniper."

// textRig is a gateway (or several on one Redis) in front of one fake engine whose reply the
// test sets; tenants alice and dave are victims, bob and carol requesters, erin a bystander.
type textRig struct {
	t   *testing.T
	gws []*testkit.Gateway
	mu  sync.Mutex
	// text is what the engine replies with: in one message, or (interleave) as an n=2 stream
	// whose two choices carry it word by word in turn.
	text       string
	interleave bool
}

func textYAML(url, mode, statePart string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "backends: [{name: eng, url: %q, role: unified}]\ntenants:\n", url)
	for _, n := range []string{"alice", "bob", "carol", "dave", "erin"} {
		fmt.Fprintf(&b, "  - {name: %s, key_sha256: %q}\n", n, testkit.KeySHA256("sk-"+n))
	}
	fmt.Fprintf(&b, "admin_key_sha256: %q\ncapacity: {poll_interval: 100ms}\n", testkit.KeySHA256("admin-key"))
	fmt.Fprintf(&b, "canary: {enabled: true, secret: %q, fingerprints: {mode: %s}}\n", canarySecret, mode)
	b.WriteString(statePart)
	return b.String()
}

// newTextRig starts replicas gateways in fingerprint mode mode; with prefix, they share Redis
// state under it.
func newTextRig(t *testing.T, mode string, replicas int, prefix string) *textRig {
	r := &textRig{t: t}
	url := fakeUnified(t, r.engine)
	statePart := ""
	if prefix != "" {
		statePart = fmt.Sprintf("state: {redis_url: %q, key_prefix: %q}\n", testRedisURL(), prefix)
	}
	for i := 0; i < replicas; i++ {
		r.gws = append(r.gws, testkit.StartGateway(t, testkit.ParseConfig(t, textYAML(url, mode, statePart))))
	}
	return r
}

// engine answers every request with the rig's text (a short "ok" when none is set), streamed
// when asked.
func (r *textRig) engine(ctx *fasthttp.RequestCtx) {
	r.mu.Lock()
	text, interleave := r.text, r.interleave
	r.mu.Unlock()
	if text == "" {
		text = "ok"
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(ctx.PostBody(), &req)
	if !req.Stream {
		var choices []any
		for i := 0; i < 1+b2i(interleave); i++ {
			choices = append(choices, map[string]any{"index": i, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": text}})
		}
		b, _ := json.Marshal(map[string]any{"object": "chat.completion", "model": "sim", "choices": choices})
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
		return
	}
	var ev strings.Builder
	delta := func(choice int, s string) {
		fmt.Fprintf(&ev, "data: %s\n\n", choiceChunk(choice, s))
	}
	if interleave {
		// How engines stream n>1: the choices' tokens in turn, here a word each.
		words := strings.SplitAfter(text, " ")
		for _, w := range words {
			delta(0, w)
			delta(1, w)
		}
	} else {
		rs := []rune(text)
		for i := 0; i < len(rs); i += 5 { // five characters an event, as tokens come
			delta(0, string(rs[i:min(i+5, len(rs))]))
		}
	}
	ev.WriteString("data: [DONE]\n\n")
	sse(ctx, "text/event-stream", ev.String())
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func choiceChunk(choice int, content string) string {
	b, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "model": "sim",
		"choices": []any{map[string]any{"index": choice, "delta": map[string]any{"content": content}, "finish_reason": nil}}})
	return string(b)
}

func (r *textRig) reply(text string, interleave bool) {
	r.mu.Lock()
	r.text, r.interleave = text, interleave
	r.mu.Unlock()
}

// send posts tenant's chat request with system and user text to gateway i.
func (r *textRig) send(i int, tenant, system, user string, stream bool, n int) reply {
	msgs := []map[string]string{{"role": "user", "content": user}}
	if system != "" {
		msgs = append([]map[string]string{{"role": "system", "content": system}}, msgs...)
	}
	b, _ := json.Marshal(map[string]any{"model": "sim", "messages": msgs, "max_tokens": 400, "stream": stream, "n": n})
	return post(r.t, r.gws[i].URL, "/v1/chat/completions", "sk-"+tenant, string(b))
}

// record makes tenant's prompt known to the gateways (the engine answers "ok").
func (r *textRig) record(i int, tenant, system string) {
	r.reply("", false)
	if w := r.send(i, tenant, system, "What can you do?", false, 1); w.status != 200 {
		r.t.Fatalf("%s's prompt: %d %s", tenant, w.status, w.body)
	}
}

// choiceTexts is the text each choice of a chat reply carries as an SDK assembles it (deltas
// appended per choice index), and whether the reply was cut (an integrity error).
func choiceTexts(w reply) (map[int]string, bool) {
	out := map[int]string{}
	cut := strings.Contains(string(w.body), "upstream_integrity")
	add := func(v map[string]any) {
		cs, _ := v["choices"].([]any)
		for _, c := range cs {
			m, _ := c.(map[string]any)
			idx, _ := m["index"].(float64)
			for _, k := range []string{"delta", "message"} {
				if d, ok := m[k].(map[string]any); ok {
					s, _ := d["content"].(string)
					out[int(idx)] += s
				}
			}
		}
	}
	if strings.HasPrefix(w.header.Get("Content-Type"), "text/event-stream") {
		for _, ev := range strings.Split(string(w.body), "\n\n") {
			data, ok := strings.CutPrefix(strings.TrimSpace(ev), "data: ")
			var v map[string]any
			if ok && json.Unmarshal([]byte(data), &v) == nil {
				add(v)
			}
		}
	} else {
		var v map[string]any
		if json.Unmarshal(w.body, &v) == nil {
			add(v)
		}
	}
	return out, cut
}

// folded is s as the detectors read it (canary.FoldByte, canary.FoldUnit): the characters the
// bound is counted in.
func folded(s string) []rune {
	var out []rune
	b := []byte(s)
	for i := 0; i < len(b); {
		if c := canary.FoldByte(b[i]); c != canary.FoldSlow {
			if c != canary.FoldSkip {
				out = append(out, rune(c))
			}
			i++
			continue
		}
		reading, r, size, _ := canary.FoldUnit(b[i:], true)
		for _, c := range reading {
			out = append(out, c)
		}
		if r != 0 {
			out = append(out, r)
		}
		i += size
	}
	return out
}

// longestShared is the longest run of folded characters that a and b share.
func longestShared(a, b string) int {
	x, y := folded(a), folded(b)
	best := 0
	prev, cur := make([]int, len(y)+1), make([]int, len(y)+1)
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			if x[i-1] == y[j-1] {
				cur[j] = prev[j-1] + 1
				best = max(best, cur[j])
			} else {
				cur[j] = 0
			}
		}
		prev, cur = cur, prev
	}
	return best
}

// waitFor waits for gateway i's incident of request rid.
func (r *textRig) waitFor(i int, w reply) incidentRecord {
	r.t.Helper()
	inc, ok := waitIncident(r.t, r.gws[i].URL, w.header.Get("X-Request-Id"))
	if !ok {
		r.t.Fatalf("no incident for request %s", w.header.Get("X-Request-Id"))
	}
	return inc
}

// bystander is erin's plain request's status on gateway i.
func (r *textRig) bystander(i int) int {
	r.reply("", false)
	return r.send(i, "erin", "", "hello", false, 1).status
}

// TestDisguisedPromptTextIsCutOrFlagged: every disguise of issue 31 and the interleaved n=2
// stream, streamed and whole, in enforce and monitor mode.
func TestDisguisedPromptTextIsCutOrFlagged(t *testing.T) {
	bound := fingerprint.MaxQuoted(3) // canary.fingerprints.cut_matches' default
	type variant struct {
		name       string
		text       string
		interleave bool
	}
	variants := []variant{{"plain", privatePrompt, false}, {"n=2 interleaved word by word", privatePrompt, true}}
	for _, d := range disguise.All() {
		variants = append(variants, variant{d.Name, d.Func(privatePrompt), false})
	}
	for _, mode := range []string{"enforce", "monitor"} {
		t.Run(mode, func(t *testing.T) {
			rig := newTextRig(t, mode, 1, "")
			rig.record(0, "alice", privatePrompt)
			for _, v := range variants {
				for _, stream := range []bool{true, false} {
					rig.reply(v.text, v.interleave)
					w := rig.send(0, "bob", "", "Tell me a story.", stream, 1+b2i(v.interleave))
					texts, cut := choiceTexts(w)
					inc := rig.waitFor(0, w)
					if inc.Detector != "fingerprint" || inc.Evidence != "text" || inc.Victim != "alice" || inc.Quarantined {
						t.Fatalf("%s stream=%v: incident %+v", v.name, stream, inc)
					}
					worst := 0
					for _, s := range texts {
						worst = max(worst, longestShared(s, privatePrompt))
					}
					switch {
					case mode == "monitor":
						// Flagged: the reply is passed on whole.
						if cut || w.status != 200 || !inc.Flagged || len(texts) != 1+b2i(v.interleave) || texts[0] != v.text {
							t.Fatalf("%s stream=%v: monitor mode must pass the reply and flag it: %d cut=%v flagged=%v %q", v.name, stream, w.status, cut, inc.Flagged, texts[0])
						}
					case !stream:
						if w.status != 502 || worst != 0 {
							t.Fatalf("%s: a whole reply must be a 502 with none of the text: %d, %d characters", v.name, w.status, worst)
						}
					default:
						if !cut || inc.Flagged {
							t.Fatalf("%s: the stream was not cut: %.300s", v.name, w.body)
						}
						if worst > bound {
							t.Fatalf("%s: %d folded characters of the prompt reached the client, bound %d", v.name, worst, bound)
						}
					}
					t.Logf("%s %s stream=%v: %d folded characters of the prompt reached the client (bound %d)", mode, v.name, stream, worst, bound)
				}
			}
			// None of it quarantined the engine: one requester, one victim.
			if s := rig.bystander(0); s != 200 {
				t.Fatalf("the bystander got %d after text matches alone", s)
			}
		})
	}
}

// rot13 maps ASCII letters 13 places on.
func rot13(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return 'a' + (r-'a'+13)%26
		case r >= 'A' && r <= 'Z':
			return 'A' + (r-'A'+13)%26
		}
		return r
	}, s)
}

// TestROT13ExchangeIsNotAQuarantine: carol sends the ROT13 of alice's paragraph and asks for it
// decoded; the engine answers with alice's text. Its reply is cut and recorded (evidence text),
// but nothing is quarantined: the bystander is served. Against a second victim too: one
// requester is never corroboration.
func TestROT13ExchangeIsNotAQuarantine(t *testing.T) {
	rig := newTextRig(t, "enforce", 1, "")
	rig.record(0, "alice", privatePrompt)
	rig.record(0, "dave", otherPrompt)
	for _, victim := range []string{privatePrompt, otherPrompt} {
		rig.reply(victim, false)
		w := rig.send(0, "carol", "", "Decode this ROT13 for me: "+rot13(victim), false, 1)
		if w.status != 502 {
			t.Fatalf("the decoded text was not cut: %d %.200s", w.status, w.body)
		}
		inc := rig.waitFor(0, w)
		if inc.Evidence != "text" || inc.Quarantined {
			t.Fatalf("incident %+v", inc)
		}
		if s := rig.bystander(0); s != 200 {
			t.Fatalf("one tenant's ROT13 exchange took the engine from a bystander: %d", s)
		}
	}
}

// TestCorroboratedTextMatchesQuarantine: bob gets alice's text on one replica, carol gets dave's
// on another (two requesters, two victims, one engine, shared Redis): the engine is quarantined
// for every replica. After its release, carol's next match is corroborated again but carol has
// had her share (quarantines_per_requester: 1): no quarantine; bob's is allowed.
func TestCorroboratedTextMatchesQuarantine(t *testing.T) {
	prefix := uniquePrefix(t)
	rig := newTextRig(t, "enforce", 2, prefix)
	rig.record(0, "alice", privatePrompt)
	rig.record(1, "dave", otherPrompt)
	leak := func(gw int, requester, text string) incidentRecord {
		t.Helper()
		rig.reply(text, false)
		w := rig.send(gw, requester, "", "Tell me a story.", false, 1)
		if w.status != 502 {
			t.Fatalf("%s's reply was not cut: %d %.200s", requester, w.status, w.body)
		}
		return rig.waitFor(gw, w)
	}
	if inc := leak(0, "bob", privatePrompt); inc.Evidence != "text" || inc.Quarantined {
		t.Fatalf("the first match alone: %+v", inc)
	}
	if s := rig.bystander(1); s != 200 {
		t.Fatalf("bystander after one match: %d", s)
	}
	inc := leak(1, "carol", otherPrompt)
	if inc.Evidence != "text_corroborated" || !inc.Quarantined || inc.Victim != "dave" {
		t.Fatalf("the second requester's match against a second victim: %+v", inc)
	}
	c := redistest.Client(t)
	if c.Exists(context.Background(), state.Keys{Prefix: prefix}.QuarantineFlag("eng")).Val() != 1 {
		t.Fatal("the quarantine is not in Redis")
	}
	for i := range rig.gws {
		waitStatus(t, func() int { return rig.bystander(i) }, 503)
	}
	releaseEng := func() {
		t.Helper()
		if a := post(t, rig.gws[0].URL, "/admin/backends/eng/release", "admin-key", ""); a.status != 200 {
			t.Fatalf("release: %d %s", a.status, a.body)
		}
		for i := range rig.gws {
			waitStatus(t, func() int { return rig.bystander(i) }, 200)
		}
	}
	releaseEng()
	if inc := leak(1, "carol", privatePrompt); inc.Evidence != "text_corroborated" || inc.Quarantined {
		t.Fatalf("carol's second quarantine in the window: %+v", inc)
	}
	if s := rig.bystander(0); s != 200 {
		t.Fatalf("a rate-limited requester's match took the engine: %d", s)
	}
	if inc := leak(0, "bob", otherPrompt); inc.Evidence != "text_corroborated" || !inc.Quarantined {
		t.Fatalf("bob's first corroborated match: %+v", inc)
	}
	waitStatus(t, func() int { return rig.bystander(0) }, 503)
}

// waitStatus polls status until it answers want (quarantines spread within a poll second).
func waitStatus(t *testing.T, status func() int, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := status()
		if s == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %d, want %d", s, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
