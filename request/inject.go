package request

import (
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvgate/kvgate/canary"
)

// OwnText is everything the client sent to be rendered into the prompt (message text, names,
// tool calls, reasoning, tool definitions, schemas, template arguments, suffix, system and turns),
// as the engine will see it (JSON strings decoded). A foreign marker in it that a reply repeats
// is an echo, not a leak, so a tenant cannot get backends quarantined by quoting a stolen marker.
func (r *Request) OwnText() string {
	var own strings.Builder
	for i, m := range r.messages {
		own.WriteString(r.msgText[i])
		own.WriteByte('\n')
		for _, k := range []string{"name", "tool_calls", "function_call", "reasoning_content", "tool_call_id"} {
			appendJSONStrings(&own, m[k])
		}
	}
	for _, k := range []string{"tools", "functions", "response_format", "chat_template_kwargs"} {
		appendJSONStrings(&own, r.Fields[k])
	}
	for _, t := range r.texts {
		own.WriteString(t)
		own.WriteByte('\n')
	}
	own.WriteString(r.suffix)
	own.WriteString(r.system)
	for _, t := range r.turns {
		own.WriteString("\n" + t.Content)
	}
	own.WriteString(r.extra)
	return own.String()
}

// Inject splices marker into the typed request, where the engine's chat template or prompt
// will carry it: the system text (Responses, Messages), a prefix of each text prompt
// (completions, /generate), or the end of the system message (chat; added if absent), or the
// first message's start with prefix. every > 0 repeats it every that many bytes of text. It
// returns false for a token-id prompt, which has no text to carry a marker. Call before Render.
func (r *Request) Inject(marker string, every int, prefix bool) bool {
	if r.texts == nil && r.messages == nil && r.turns == nil {
		return false
	}
	if r.Kind == Responses || r.Kind == Messages {
		r.injectSystem(marker)
		return true
	}
	if r.Kind != Chat {
		texts := make([]string, len(r.texts))
		for i, t := range r.texts {
			texts[i] = canary.InjectPrefix(canary.InjectEvery(t, marker, every), marker)
		}
		r.setTexts(texts)
		return true
	}
	msgs := make([]map[string]json.RawMessage, 0, len(r.messages)+1)
	sys := -1
	for i, m := range r.messages {
		c := make(map[string]json.RawMessage, len(m))
		for k, v := range m {
			c[k] = v
		}
		if every > 0 {
			if s, ok := stringContent(c); ok {
				c["content"] = mustJSON(canary.InjectEvery(s, marker, every))
			}
		}
		if role := r.roles[i]; sys < 0 && (role == "system" || role == "developer") {
			sys = i
		}
		msgs = append(msgs, c)
	}
	switch {
	case prefix && len(msgs) > 0:
		appendToContent(msgs[0], marker, true)
	case sys >= 0:
		appendToContent(msgs[sys], marker, false)
	default:
		msgs = append([]map[string]json.RawMessage{{"role": mustJSON("system"), "content": mustJSON(marker)}}, msgs...)
		r.roles, r.names = append([]string{"system"}, r.roles...), append([]string{""}, r.names...)
	}
	r.setMessages(msgs)
	return true
}

// appendJSONStrings writes every string (and object key) of a JSON value, decoded, one per line.
func appendJSONStrings(b *strings.Builder, raw json.RawMessage) {
	if len(raw) == 0 {
		return
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
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
