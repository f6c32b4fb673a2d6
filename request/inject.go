package request

import (
	"bytes"
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
	if every <= 0 && r.spliceChat(marker, prefix) {
		return true
	}
	r.injectChat(marker, every, prefix)
	return true
}

// injectChat is Inject for chat by decoding and encoding the messages: repetitions, and content
// that is not a plain string.
func (r *Request) injectChat(marker string, every int, prefix bool) {
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
			} else if parts, ok := everyInParts(c["content"], marker, every); ok {
				c["content"] = parts
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

// everyInParts repeats the marker through each text part of a parts content (InjectEvery on
// each part's text; image parts are left as they are). false when content is not a parts array.
func everyInParts(content json.RawMessage, marker string, every int) (json.RawMessage, bool) {
	var parts []map[string]json.RawMessage
	if len(content) == 0 || content[0] != '[' || json.Unmarshal(content, &parts) != nil {
		return nil, false
	}
	for _, p := range parts {
		var typ, text string
		if json.Unmarshal(p["type"], &typ) == nil && typ == "text" && json.Unmarshal(p["text"], &text) == nil {
			p["text"] = mustJSON(canary.InjectEvery(text, marker, every))
		}
	}
	return mustJSON(parts), true
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

// rawSystemRole is the role of the system message the marker is added in when there is none.
var rawSystemRole = json.RawMessage(`"system"`)

// spliceChat is Inject for chat without repetitions, done in the body's own bytes (issue 23):
// the marker goes into the raw JSON string of the one message that carries it, or a system
// message is put first; nothing else is decoded or encoded again. The marker (KVG- and base32)
// needs no JSON escaping. It returns false, changing nothing, where the message's content is not
// a plain string or its key is escaped: Inject then takes the general path.
func (r *Request) spliceChat(marker string, prefix bool) bool {
	raw := r.Fields["messages"]
	target := -1
	if prefix {
		target = 0
	} else {
		for i, role := range r.roles {
			if role == "system" || role == "developer" {
				target = i
				break
			}
		}
	}
	if target < 0 {
		open := skipSpace(raw, 0)
		if open >= len(raw) || raw[open] != '[' {
			return false
		}
		content := make([]byte, 0, len(marker)+2)
		content = append(append(append(content, '"'), marker...), '"')
		msg := `{"role":"system","content":` + string(content) + `},`
		out := make([]byte, 0, len(raw)+len(msg))
		out = append(append(append(out, raw[:open+1]...), msg...), raw[open+1:]...)
		r.Fields["messages"] = out
		r.messages = append([]map[string]json.RawMessage{{"role": rawSystemRole, "content": content}}, r.messages...)
		r.roles, r.names = append([]string{"system"}, r.roles...), append([]string{""}, r.names...)
		r.contents = append([]string{marker}, r.contents...)
		r.msgText = append([]string{marker}, r.msgText...)
		return true
	}
	cs, ce, ok := contentSpan(raw, target)
	if !ok || raw[cs] != '"' {
		return false // parts, null or absent content: the general path
	}
	old := raw[cs:ce] // a JSON string with its quotes
	// Room for the marker and an escaped "\n\n" (4 bytes): the body is never regrown.
	out := make([]byte, 0, len(raw)+len(marker)+4)
	out = append(out, raw[:cs]...)
	var text string
	switch {
	case prefix:
		out = append(append(append(out, '"'), marker...), `\n\n`...)
		out = append(out, old[1:]...)
		text = canary.InjectPrefix(r.contents[target], marker)
	case len(old) == 2: // "": the marker alone (InjectSystemEnd)
		out = append(append(append(out, '"'), marker...), '"')
		text = canary.InjectSystemEnd("", marker)
	default:
		out = append(out, old[:len(old)-1]...)
		out = append(append(append(out, `\n\n`...), marker...), '"')
		text = canary.InjectSystemEnd(r.contents[target], marker)
	}
	end := len(out)
	out = append(out, raw[ce:]...)
	r.Fields["messages"] = out
	r.messages[target]["content"] = out[cs:end:end]
	r.contents[target] = text
	r.msgText[target] = text + renderedExtras(r.messages[target])
	return true
}

// contentSpan finds the value of message k's "content" key in raw (a valid JSON array of
// objects, as the decoder accepted it): its start and end offsets. false when there is no such
// value or some key on the way is escaped (it could spell content).
func contentSpan(raw []byte, k int) (int, int, bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return 0, 0, false
	}
	i++
	for idx := 0; ; idx++ {
		i = skipSpace(raw, i)
		if i >= len(raw) || raw[i] == ']' {
			return 0, 0, false
		}
		end := skipValue(raw, i)
		if idx == k {
			return objectValue(raw[:end], i, "content")
		}
		i = skipSpace(raw, end)
		if i >= len(raw) || raw[i] != ',' {
			return 0, 0, false
		}
		i++
	}
}

// objectValue finds key's value in the object starting at b[i] (the object ends b).
func objectValue(b []byte, i int, key string) (int, int, bool) {
	if b[i] != '{' {
		return 0, 0, false
	}
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return 0, 0, false // '}' or malformed
		}
		ke := stringEnd(b, i+1)
		if ke < 0 {
			return 0, 0, false
		}
		name := b[i+1 : ke]
		if bytes.IndexByte(name, '\\') >= 0 {
			return 0, 0, false
		}
		i = skipSpace(b, ke+1)
		if i >= len(b) || b[i] != ':' {
			return 0, 0, false
		}
		vs := skipSpace(b, i+1)
		if vs >= len(b) {
			return 0, 0, false
		}
		ve := skipValue(b, vs)
		if string(name) == key {
			return vs, ve, true
		}
		i = skipSpace(b, ve)
		if i >= len(b) || b[i] != ',' {
			return 0, 0, false
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// skipValue returns the offset just past the JSON value that starts at b[i] (b valid JSON).
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		if e := stringEnd(b, i+1); e >= 0 {
			return e + 1
		}
		return len(b)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				e := stringEnd(b, i+1)
				if e < 0 {
					return len(b)
				}
				i = e + 1
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	default: // a number or a literal
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && !isJSONSpace(b[i]) {
			i++
		}
		return i
	}
}
