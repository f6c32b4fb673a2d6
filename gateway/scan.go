package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/canary"
)

// guard scans one reply for canary markers. Text that arrives in pieces (chat deltas,
// completions text, tool-call arguments, logprob tokens) keeps one stateful scanner per field
// path, so a marker split across events or array items is still seen whole; /generate's
// cumulative text is scanned on its new suffix only. Whole values (ids, model names, roles,
// finish reasons, map keys) are scanned one by one.
type guard struct {
	x        *exchange
	scanners map[string]*canary.Scanner
	order    []string // scanner keys in creation order, for a deterministic flush
	// generate: raw cumulative text seen so far and what was emitted of it, per index
	rawCum, outCum map[string]string
	leak           *canary.Hit
	buf            []byte
	// whole: a non-streaming body, whose text fields are complete values.
	whole bool
}

func (x *exchange) newGuard() *guard {
	if x.g.keyring == nil {
		return nil
	}
	return &guard{x: x, scanners: map[string]*canary.Scanner{}, rawCum: map[string]string{}, outCum: map[string]string{}}
}

func (gd *guard) scanner(key string) *canary.Scanner {
	s := gd.scanners[key]
	if s == nil {
		s = gd.x.g.keyring.NewScanner(gd.x.tenant.Name, gd.x.echoes)
		gd.scanners[key] = s
		gd.order = append(gd.order, key)
	}
	return s
}

// feed scans one piece of streamed text; it returns what may be emitted now.
func (gd *guard) feed(key, text string) (string, bool) {
	out, v := gd.scanner(key).Feed(gd.buf[:0], []byte(text))
	gd.buf = out[:0]
	gd.note(v)
	if v.Leak != nil {
		return "", false
	}
	return string(out), true
}

func (gd *guard) note(v canary.Verdict) {
	for _, e := range v.Echoes {
		gd.x.g.recordIncident(gd.x, canary.KindEcho, e)
	}
	if v.Leak != nil && gd.leak == nil {
		gd.leak = v.Leak
	}
}

// scanString scans a whole value.
func (gd *guard) scanString(s string) (string, bool) {
	if !strings.Contains(s, "KVG") {
		return s, true
	}
	out, v := gd.x.g.keyring.ScanAll(gd.x.tenant.Name, gd.x.echoes, []byte(s))
	gd.note(v)
	return string(out), v.Leak == nil
}

// streamedField says whether a field carries text in pieces.
func streamedField(name string) bool {
	switch name {
	case "content", "reasoning_content", "text", "arguments", "refusal":
		return true
	}
	return false
}

// walk scans every string and map key in v. Strings under a streamed field name, or anywhere
// under a logprobs object, go through the stateful scanner of their path; array items are keyed
// by their "index" when they have one (choices, tool calls) and otherwise share the path, so a
// sequence of tokens is one stream.
func (gd *guard) walk(v any, path string, stream bool, changed *bool) (any, bool) {
	switch t := v.(type) {
	case string:
		var out string
		var ok bool
		switch {
		case stream:
			// Logprob tokens: a sequence whose items must keep their own text. The stream
			// scanner only detects (a marker split across tokens cuts the reply); each token
			// is cleaned on its own.
			if _, ok = gd.feed(path, t); ok {
				out, ok = gd.scanString(t)
			}
		case !gd.whole && streamedField(path[strings.LastIndexByte(path, '.')+1:]):
			out, ok = gd.feed(path, t)
		default:
			out, ok = gd.scanString(t)
		}
		if !ok {
			return nil, false
		}
		*changed = *changed || out != t
		return out, true
	case map[string]any:
		for k, e := range t {
			if stream {
				// Completions' top_logprobs are maps keyed by token: the keys are a sequence too.
				if _, ok := gd.feed(path+".#key", k); !ok {
					return nil, false
				}
			}
			if strings.Contains(k, "KVG") {
				clean, ok := gd.scanString(k)
				if !ok {
					return nil, false
				}
				delete(t, k)
				k, *changed = clean, true
			}
			r, ok := gd.walk(e, path+"."+k, stream || strings.Contains(k, "logprobs"), changed)
			if !ok {
				return nil, false
			}
			t[k] = r
		}
	case []any:
		for i, e := range t {
			seg := "*"
			if m, ok := e.(map[string]any); ok {
				if idx, ok := m["index"].(json.Number); ok {
					seg = "i" + idx.String()
				}
			}
			r, ok := gd.walk(e, path+"."+seg, stream, changed)
			if !ok {
				return nil, false
			}
			t[i] = r
		}
	}
	return v, true
}

var errTrailing = errors.New("data after the JSON value")

// decodeOne decodes exactly one JSON value (numbers kept exact); anything after it is an error,
// so no text can ride unscanned behind a valid value.
func decodeOne(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errTrailing
	}
	return v, nil
}

// body scans a whole non-streaming reply. Replies without "KVG" (or JSON escapes that could
// hide it) pass byte-identical; a reply with a foreign marker returns ok=false.
func (gd *guard) body(b []byte) ([]byte, bool) {
	if !bytes.Contains(b, []byte("KVG")) && !bytes.Contains(b, []byte(`\u`)) {
		return b, true
	}
	v, err := decodeOne(b)
	if err != nil {
		// Not one JSON value: scan it as text.
		out, ok := gd.scanString(string(b))
		return []byte(out), ok
	}
	changed := false
	// Every string of a whole body is a whole value, except that its sequences (logprob tokens)
	// may split a marker: walk keeps those streamed.
	gd.whole = true
	v, ok := gd.walk(v, "", false, &changed)
	if !ok {
		return nil, false
	}
	if gd.flushHeld() {
		return nil, false
	}
	if !changed {
		return b, true
	}
	out, _ := json.Marshal(v)
	return out, true
}

// flushHeld settles every scanner at the end of a whole body; true means a leak.
func (gd *guard) flushHeld() bool {
	for _, key := range gd.order {
		_, v := gd.scanners[key].FlushVerdict(nil)
		gd.note(v)
	}
	return gd.leak != nil
}

// event scans one SSE event. It returns the bytes to send (the original when nothing changed)
// and false when the reply must be cut.
func (gd *guard) event(ev []byte) ([]byte, bool) {
	data, ok := sseData(ev)
	if !ok {
		// Comments, multi-line data, other fields: never let a marker through them either.
		out, ok := gd.scanString(string(ev))
		if !ok {
			return nil, false
		}
		return []byte(out), true
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		// Release what the scanners still hold, in events of their own, before [DONE].
		return append(gd.flush(), ev...), gd.leak == nil
	}
	v, err := decodeOne(data)
	obj, isObj := v.(map[string]any)
	if err != nil || !isObj {
		out, ok := gd.scanString(string(data))
		if !ok {
			return nil, false
		}
		if out == string(data) {
			return ev, true
		}
		return []byte("data: " + out + "\n\n"), true
	}
	changed := false
	var restore func()
	if gd.x.kind == routeGenerate {
		if t, ok := obj["text"].(string); ok {
			key := "0"
			if idx, ok := obj["index"].(json.Number); ok {
				key = idx.String()
			}
			suffix := t
			if raw := gd.rawCum[key]; strings.HasPrefix(t, raw) {
				suffix = t[len(raw):] // SGLang's stream repeats the whole text so far
			}
			out, ok := gd.feed("gen:"+key, suffix)
			if !ok {
				return nil, false
			}
			gd.rawCum[key] = t
			gd.outCum[key] += out
			changed = changed || gd.outCum[key] != t
			delete(obj, "text") // scanned above as a stream; put back below
			restore = func() { obj["text"] = gd.outCum[key] }
		}
	}
	if _, ok := gd.walk(obj, "", false, &changed); !ok {
		return nil, false
	}
	if restore != nil {
		restore()
	}
	if !changed {
		return ev, true
	}
	return gd.marshalEvent(obj), true
}

func (gd *guard) marshalEvent(obj map[string]any) []byte {
	b, _ := json.Marshal(obj)
	return append(append([]byte("data: "), b...), "\n\n"...)
}

// flush releases text the scanners held back at the end of the stream. Held text of a reply's
// main text fields comes as one event each in the reply's own shape; what other fields held (at
// most a trailing "K", "KV" or "KVG") is dropped.
func (gd *guard) flush() []byte {
	var out []byte
	for _, key := range gd.order {
		rest, v := gd.scanners[key].FlushVerdict(nil)
		gd.note(v)
		if len(rest) == 0 || gd.leak != nil {
			continue
		}
		if idx, ok := strings.CutPrefix(key, "gen:"); ok {
			gd.outCum[idx] += string(rest)
			out = append(out, gd.marshalEvent(map[string]any{"text": gd.outCum[idx], "meta_info": map[string]any{"id": gd.x.engineRID}})...)
			continue
		}
		// ".choices.i<N>.delta.<field>" (chat) or ".choices.i<N>.text" (completions)
		parts := strings.Split(key, ".")
		if len(parts) < 4 || parts[1] != "choices" || !strings.HasPrefix(parts[2], "i") {
			continue
		}
		n, err := strconv.Atoi(parts[2][1:])
		if err != nil {
			continue
		}
		switch {
		case len(parts) == 5 && parts[3] == "delta" && (parts[4] == "content" || parts[4] == "reasoning_content"):
			out = append(out, gd.marshalEvent(map[string]any{"object": "chat.completion.chunk", "choices": []any{
				map[string]any{"index": n, "delta": map[string]any{parts[4]: string(rest)}, "finish_reason": nil}}})...)
		case len(parts) == 4 && parts[3] == "text":
			out = append(out, gd.marshalEvent(map[string]any{"object": "text_completion", "choices": []any{
				map[string]any{"index": n, "text": string(rest), "finish_reason": nil}}})...)
		}
	}
	return out
}

// sseData returns the payload of a single-line "data: " event.
func sseData(ev []byte) ([]byte, bool) {
	ev = bytes.TrimRight(ev, "\r\n")
	if !bytes.HasPrefix(ev, []byte("data:")) || bytes.IndexByte(ev, '\n') >= 0 {
		return nil, false
	}
	return bytes.TrimSpace(ev[len("data:"):]), true
}
