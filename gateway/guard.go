package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/canary"
)

// This file is the canary side of the pipeline: markers go into prompts before counting, and
// every reply is scanned on its decoded text before it reaches the client.

// inject puts the tenant's current marker into the request (before render, so it is counted)
// and remembers which foreign markers the client itself sent (echoes, not leaks).
func (x *exchange) inject() {
	g := x.g
	if g.keyring == nil {
		return
	}
	req := x.req
	// Foreign markers in the client's own prompt: any reply that repeats them is an echo.
	var own strings.Builder
	for _, m := range req.messages {
		t, _ := messageText(m["content"])
		own.WriteString(t)
		own.WriteByte('\n')
	}
	for _, t := range req.texts {
		own.WriteString(t)
		own.WriteByte('\n')
	}
	x.echoes = g.keyring.FindMarkers(own.String())
	if x.tenant.CanaryOptOut {
		g.metrics.canarySkipped.WithLabelValues("opt_out").Inc()
		return
	}
	if req.texts == nil && req.messages == nil {
		g.metrics.canarySkipped.WithLabelValues("input_ids").Inc()
		return
	}
	marker, _ := g.keyring.Current(x.tenant.Name, time.Now())
	every := g.cfg.Canary.EveryBytes
	if req.kind != routeChat {
		texts := make([]string, len(req.texts))
		for i, t := range req.texts {
			texts[i] = canary.InjectPrefix(canary.InjectEvery(t, marker, every), marker)
		}
		req.setTexts(texts)
		g.metrics.canaryInjected.Inc()
		return
	}
	msgs := make([]map[string]json.RawMessage, 0, len(req.messages)+1)
	sys := -1
	for i, m := range req.messages {
		c := make(map[string]json.RawMessage, len(m))
		for k, v := range m {
			c[k] = v
		}
		if every > 0 {
			if s, ok := stringContent(c); ok {
				c["content"] = mustJSON(canary.InjectEvery(s, marker, every))
			}
		}
		var role string
		_ = json.Unmarshal(c["role"], &role)
		if sys < 0 && (role == "system" || role == "developer") {
			sys = i
		}
		msgs = append(msgs, c)
	}
	switch {
	case g.cfg.Canary.Placement == "prefix" && len(msgs) > 0:
		appendToContent(msgs[0], marker, true)
	case sys >= 0:
		appendToContent(msgs[sys], marker, false)
	default:
		msgs = append([]map[string]json.RawMessage{{"role": mustJSON("system"), "content": mustJSON(marker)}}, msgs...)
	}
	req.setMessages(msgs)
	g.metrics.canaryInjected.Inc()
}

func stringContent(m map[string]json.RawMessage) (string, bool) {
	var s string
	if raw, ok := m["content"]; ok && json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	return "", false
}

// appendToContent adds the marker to a message: to a string content directly, to a parts array
// as a text part of its own.
func appendToContent(m map[string]json.RawMessage, marker string, prefix bool) {
	if s, ok := stringContent(m); ok || isNull(m["content"]) || m["content"] == nil {
		if prefix {
			m["content"] = mustJSON(canary.InjectPrefix(s, marker))
		} else {
			m["content"] = mustJSON(canary.InjectSystemEnd(s, marker))
		}
		return
	}
	var parts []json.RawMessage
	_ = json.Unmarshal(m["content"], &parts) // validated at parse time
	part := mustJSON(map[string]string{"type": "text", "text": "\n\n" + marker + "\n\n"})
	if prefix {
		parts = append([]json.RawMessage{part}, parts...)
	} else {
		parts = append(parts, part)
	}
	m["content"] = mustJSON(parts)
}

// guard scans one reply. Streams keep one scanner per (choice, field), so a marker split across
// events is still seen whole; /generate's cumulative text is scanned on its new suffix only.
type guard struct {
	x        *exchange
	scanners map[string]*canary.Scanner
	// generate: raw cumulative text seen so far and what was emitted of it, per index
	rawCum, outCum map[string]string
	leak           *canary.Hit
	buf            []byte
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

// scanString scans a whole string that is not part of a stream of text (logprob tokens, tool
// arguments, non-streaming bodies).
func (gd *guard) scanString(s string) (string, bool) {
	if !strings.Contains(s, "KVG") {
		return s, true
	}
	out, v := gd.x.g.keyring.ScanAll(gd.x.tenant.Name, gd.x.echoes, []byte(s))
	gd.note(v)
	return string(out), v.Leak == nil
}

// walkStrings applies f to every string in v, replacing it with f's result; it stops at the
// first false.
func walkStrings(v any, f func(string) (string, bool)) (any, bool) {
	switch t := v.(type) {
	case string:
		return f(t)
	case map[string]any:
		for k, e := range t {
			r, ok := walkStrings(e, f)
			if !ok {
				return nil, false
			}
			t[k] = r
		}
	case []any:
		for i, e := range t {
			r, ok := walkStrings(e, f)
			if !ok {
				return nil, false
			}
			t[i] = r
		}
	}
	return v, true
}

func decodeAny(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers pass through exactly
	var v any
	err := dec.Decode(&v)
	return v, err
}

// body scans a whole non-streaming reply. Replies without "KVG" pass byte-identical; a reply
// with a foreign marker returns ok=false.
func (gd *guard) body(b []byte) ([]byte, bool) {
	if !bytes.Contains(b, []byte("KVG")) && !bytes.Contains(b, []byte(`\u`)) {
		return b, true
	}
	v, err := decodeAny(b)
	if err != nil {
		// Not JSON: scan as text.
		out, ok := gd.scanString(string(b))
		return []byte(out), ok
	}
	changed := false
	v, ok := walkStrings(v, func(s string) (string, bool) {
		out, ok := gd.scanString(s)
		changed = changed || out != s
		return out, ok
	})
	if !ok {
		return nil, false
	}
	if !changed {
		return b, true
	}
	out, _ := json.Marshal(v)
	return out, true
}

// event scans one SSE event. It returns the bytes to send (the original when nothing changed)
// and false when the reply must be cut.
func (gd *guard) event(ev []byte) ([]byte, bool) {
	data, ok := sseData(ev)
	if !ok {
		// Comments, multi-line data, other fields: no stream text to follow, but never let a
		// marker through them either.
		out, ok := gd.scanString(string(ev))
		if !ok {
			return nil, false
		}
		return []byte(out), true
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		// Release what the scanners still hold, in an event of its own, before [DONE].
		return append(gd.flush(), ev...), gd.leak == nil
	}
	v, err := decodeAny(data)
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
	// Text fields are scanned as streams (a marker may span events); they are set aside while
	// every other string (logprobs, tool calls, errors) is scanned statelessly.
	var restore []func()
	setAside := func(m map[string]any, field, out string) {
		delete(m, field)
		restore = append(restore, func() { m[field] = out })
	}
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
			out, ok := gd.feed(key+":text", suffix)
			if !ok {
				return nil, false
			}
			gd.rawCum[key] = t
			gd.outCum[key] += out
			changed = changed || gd.outCum[key] != t
			setAside(obj, "text", gd.outCum[key])
		}
	} else if choices, ok := obj["choices"].([]any); ok {
		for i, c := range choices {
			ch, ok := c.(map[string]any)
			if !ok {
				continue
			}
			idx := strconv.Itoa(i)
			if n, ok := ch["index"].(json.Number); ok {
				idx = n.String()
			}
			targets := []map[string]any{ch}
			if d, ok := ch["delta"].(map[string]any); ok {
				targets = append(targets, d)
			}
			for _, m := range targets {
				for _, field := range []string{"content", "reasoning_content", "text"} {
					s, ok := m[field].(string)
					if !ok {
						continue
					}
					out, ok := gd.feed(idx+":"+field, s)
					if !ok {
						return nil, false
					}
					changed = changed || out != s
					setAside(m, field, out)
				}
			}
		}
	}
	_, ok = walkStrings(obj, func(s string) (string, bool) {
		out, ok := gd.scanString(s)
		changed = changed || out != s
		return out, ok
	})
	if !ok {
		return nil, false
	}
	for _, r := range restore {
		r()
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

// flush releases text the scanners held back at the end of the stream, as one event per
// scanner in the reply's own shape.
func (gd *guard) flush() []byte {
	var out []byte
	for key, s := range gd.scanners {
		rest, v := s.FlushVerdict(nil)
		gd.note(v)
		if len(rest) == 0 || gd.leak != nil {
			continue
		}
		idx, field, _ := strings.Cut(key, ":")
		var obj map[string]any
		switch {
		case gd.x.kind == routeGenerate:
			gd.outCum[idx] += string(rest)
			obj = map[string]any{"text": gd.outCum[idx], "meta_info": map[string]any{"id": gd.x.rid}}
		case gd.x.kind == routeChat:
			n, _ := strconv.Atoi(idx)
			obj = map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": n, "delta": map[string]any{field: string(rest)}}}}
		default:
			n, _ := strconv.Atoi(idx)
			obj = map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": n, field: string(rest)}}}
		}
		out = append(out, gd.marshalEvent(obj)...)
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

// recordIncident stores an incident in the background (the store queues while Redis is away)
// and, for a leak, quarantines every backend on the path, locally at once and for all replicas.
func (g *Gateway) recordIncident(x *exchange, kind string, h canary.Hit) {
	var names []string
	if x.route != nil {
		names = x.route.Backends
	}
	inc := canary.Incident{Time: time.Now().UTC(), Kind: kind, RequestID: x.rid, Victim: h.Victim,
		Requester: x.tenant.Name, Backends: names, Epoch: h.Epoch, Context: h.Context}
	g.metrics.incidents.WithLabelValues(kind).Inc()
	if kind == canary.KindLeak {
		g.log.Error("foreign canary marker in an engine reply: reply cut, backends quarantined",
			zap.String("request_id", x.rid), zap.String("requester", x.tenant.Name), zap.String("victim", h.Victim),
			zap.Strings("backends", names), zap.Uint64("epoch", h.Epoch))
		until := time.Now().Add(g.cfg.Canary.QuarantineTTL)
		for _, n := range names {
			g.quarantineLocal(n, until)
		}
	} else {
		g.log.Warn("echoed canary marker stripped (the requester's own prompt contained it)",
			zap.String("request_id", x.rid), zap.String("requester", x.tenant.Name), zap.String("victim", h.Victim))
	}
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.state.Incidents.Record(ctx, inc); err != nil {
			g.log.Error("incident not recorded", zap.String("request_id", x.rid), zap.Error(err))
		}
		if kind == canary.KindLeak {
			for _, n := range names {
				if err := g.state.Quarantine.Quarantine(ctx, n, "canary leak "+x.rid, g.cfg.Canary.QuarantineTTL); err != nil {
					g.log.Warn("quarantine not shared yet (kept locally, retried)", zap.String("backend", n), zap.Error(err))
					continue
				}
				g.confirmQuarantine(n)
			}
		}
	}()
}

// quarantineLocal takes a backend out of rotation on this replica at once and remembers it, so
// that the shared-state sync neither forgets it nor loses it while Redis is away.
func (g *Gateway) quarantineLocal(name string, until time.Time) {
	g.qmu.Lock()
	g.localQuarantine[name] = until
	g.qmu.Unlock()
	g.backends.Quarantine(name, until)
}

// confirmQuarantine forgets the local copy of a flag the store now holds: from then on the store
// decides, so an operator's release on any replica is not undone here.
func (g *Gateway) confirmQuarantine(name string) {
	g.qmu.Lock()
	delete(g.localQuarantine, name)
	g.qmu.Unlock()
}

// syncQuarantine merges the shared quarantine flags with this replica's own and applies them.
func (g *Gateway) syncQuarantine(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	active, err := g.state.Quarantine.Active(cctx)
	if err != nil {
		return // keep what we have: local state goes on while the store is away
	}
	now := time.Now()
	g.qmu.Lock()
	for name, until := range g.localQuarantine {
		switch _, shared := active[name]; {
		case !until.After(now):
			delete(g.localQuarantine, name)
		case shared:
			// The store has it: from now on the store decides (an operator may release it).
			delete(g.localQuarantine, name)
		default:
			// Our write failed (the store was away): keep it here and write it again.
			if g.state.Quarantine.Quarantine(cctx, name, "canary leak (retry)", until.Sub(now)) == nil {
				delete(g.localQuarantine, name)
			}
			active[name] = until
		}
	}
	g.qmu.Unlock()
	g.backends.SetQuarantine(active)
}
