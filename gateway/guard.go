package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/state"
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
	// Foreign markers anywhere in what the client sent to be rendered into the prompt (message
	// text, names, tool calls, reasoning, tool definitions, schemas, template arguments, suffix),
	// as the engine will see it (JSON strings decoded): a reply that repeats them is an echo, not
	// a leak, so a tenant cannot get backends quarantined by quoting a stolen marker.
	var own strings.Builder
	for i, m := range req.messages {
		own.WriteString(req.msgText[i])
		own.WriteByte('\n')
		for _, k := range []string{"name", "tool_calls", "function_call", "reasoning_content", "tool_call_id"} {
			appendJSONStrings(&own, m[k])
		}
	}
	for _, k := range []string{"tools", "functions", "response_format", "chat_template_kwargs"} {
		appendJSONStrings(&own, req.fields[k])
	}
	for _, t := range req.texts {
		own.WriteString(t)
		own.WriteByte('\n')
	}
	own.WriteString(req.suffix)
	own.WriteString(req.system)
	for _, t := range req.turns {
		own.WriteString("\n" + t.Content)
	}
	own.WriteString(req.extra)
	// Fragments count too: a reply repeating the 8 characters of a marker that the client sent
	// is the client's own text (FindMarkerFragments finds whole markers as well).
	x.echoes = g.keyring.FindMarkerFragments(own.String())
	if !req.kind.generates() {
		return // no text comes back to carry a marker; replies are still scanned
	}
	if x.tenant.CanaryOptOut {
		g.metrics.canarySkipped.WithLabelValues("opt_out").Inc()
		return
	}
	if req.texts == nil && req.messages == nil && req.turns == nil {
		g.metrics.canarySkipped.WithLabelValues("input_ids").Inc()
		return
	}
	marker, _ := g.keyring.Current(x.tenant.Name, time.Now())
	every := g.cfg.Canary.EveryBytes
	if req.kind == routeResponses || req.kind == routeMessages {
		req.injectSystem(marker)
		g.metrics.canaryInjected.Inc()
		return
	}
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
		if role := req.roles[i]; sys < 0 && (role == "system" || role == "developer") {
			sys = i
		}
		msgs = append(msgs, c)
	}
	switch {
	case g.cfg.Canary.Placement == config.PlacementPrefix && len(msgs) > 0:
		appendToContent(msgs[0], marker, true)
	case sys >= 0:
		appendToContent(msgs[sys], marker, false)
	default:
		msgs = append([]map[string]json.RawMessage{{"role": mustJSON("system"), "content": mustJSON(marker)}}, msgs...)
		req.roles, req.names = append([]string{"system"}, req.roles...), append([]string{""}, req.names...)
	}
	req.setMessages(msgs)
	g.metrics.canaryInjected.Inc()
}

// appendJSONStrings writes every string (and object key) of a JSON value, decoded, one per line.
func appendJSONStrings(b *strings.Builder, raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	v, err := decodeOne(raw)
	if err != nil {
		return
	}
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case string:
			b.WriteString(t)
			b.WriteByte('\n')
		case map[string]any:
			for k, e := range t {
				b.WriteString(k)
				b.WriteByte('\n')
				walk(e)
			}
		case []any:
			for _, e := range t {
				walk(e)
			}
		}
	}
	walk(v)
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

// recordIncident stores an incident in the background (the store queues while Redis is away)
// and, for a leak, quarantines every backend on the path, locally at once and for all replicas.
func (g *Gateway) recordIncident(x *exchange, kind string, h canary.Hit) {
	var names []string
	if x.route != nil {
		names = x.route.Backends
	}
	inc := state.Incident{Time: time.Now().UTC(), Kind: kind, RequestID: x.rid, Victim: h.Victim,
		Requester: x.tenant.Name, Backends: names, Epoch: h.Epoch, Context: h.Context}
	g.metrics.incidents.WithLabelValues(kind).Inc()
	// A short fragment in the reply to a token-id prompt whose text could not be read may be the
	// client's own: the reply is cut and the incident kept, but nothing is quarantined on it.
	quarantine := kind == state.KindLeak && !(x.idsUnread && shortFragment(h.Marker))
	if kind == state.KindLeak && !quarantine {
		g.log.Error("foreign canary marker fragment in the reply to an unreadable token-id prompt: reply cut, no quarantine",
			zap.String("request_id", x.rid), zap.String("requester", x.tenant.Name), zap.String("victim", h.Victim), zap.Strings("backends", names))
	} else if kind == state.KindLeak {
		g.log.Error("foreign canary marker in an engine reply: reply cut, backends quarantined",
			zap.String("request_id", x.rid), zap.String("engine_rid", x.engineRID), zap.String("requester", x.tenant.Name), zap.String("victim", h.Victim),
			zap.Strings("backends", names), zap.Uint64("epoch", h.Epoch))
		for _, n := range names {
			g.quarantine.Mark(n, g.cfg.Canary.QuarantineTTL, "canary leak "+x.rid)
		}
	} else {
		g.log.Warn("echoed canary marker stripped (the requester's own prompt contained it)",
			zap.String("request_id", x.rid), zap.String("requester", x.tenant.Name), zap.String("victim", h.Victim))
	}
	work := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.state.Incidents.Record(ctx, inc); err != nil {
			g.log.Error("incident not recorded", zap.String("request_id", x.rid), zap.Error(err))
		}
		if quarantine {
			for _, n := range names {
				if err := g.quarantine.Share(ctx, n); err != nil {
					g.log.Warn("quarantine not shared yet (kept locally, retried)", zap.String("backend", n), zap.Error(err))
				}
			}
		}
	}
	g.bgMu.Lock()
	if g.bgClosed {
		// Shutting down: record before the process goes, on this goroutine.
		g.bgMu.Unlock()
		work()
		return
	}
	g.bg.Add(1)
	g.bgMu.Unlock()
	go func() {
		defer g.bg.Done()
		defer panics.Recover(g.log, "incident_record")
		work()
	}()
}

// shortFragment says a hit carries fewer than canary.LooseMin marker characters: only the prefix
// scanner reports those ("KVG-" and 8 to 11 characters). A whole marker always gives at least
// LooseMin (the folded detector cuts there, before the rest arrives), and no reply lets more than
// 7 characters of a foreign marker reach a client, so a tenant cannot learn enough to fake one.
func shortFragment(marker string) bool {
	n := 0
	for i := 0; i < len(marker); i++ {
		if c := marker[i] | 0x20; c >= 'a' && c <= 'z' || marker[i] >= '2' && marker[i] <= '7' {
			n++
		}
	}
	if len(marker) >= len(canary.MarkerPrefix) && strings.EqualFold(marker[:len(canary.MarkerPrefix)], canary.MarkerPrefix) {
		n -= 3 // "KVG"
	}
	return n < canary.LooseMin
}
