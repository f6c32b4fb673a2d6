package request

import (
	"bytes"
	stdjson "encoding/json"

	json "github.com/goccy/go-json"
)

// The request's own reading of a body's top-level object and of chat messages (issue 23): the
// body is checked as JSON once (encoding/json's Valid, which allocates nothing), then walked
// for the spans of keys and values. Values are sub-slices of the body, not copies; keys the
// allow-lists name are interned, not allocated. Anything the walk does not expect falls back to
// the JSON library's decoder (parse), which also words the errors.

// interned holds every key name the allow-lists know, so a key read from a body is one of these
// strings rather than a new one.
var interned = map[string]string{}

func init() {
	add := func(m map[string]bool) {
		for k := range m {
			interned[k] = k
		}
	}
	for _, m := range allowed {
		add(m)
	}
	add(engineControl)
	add(mediaFields)
	add(messageKeys)
	add(samplingKeys)
	add(AllowList("type", "text", "id", "function", "arguments"))
	// Message roles, read as values (decodeString): every chat message has one.
	add(AllowList("system", "user", "assistant", "tool", "developer"))
}

// internKey is the decoded key of raw (its bytes between the quotes).
func internKey(raw []byte) string {
	if bytes.IndexByte(raw, '\\') >= 0 {
		return unescapeKey(raw)
	}
	if s, ok := interned[string(raw)]; ok {
		return s
	}
	return string(raw)
}

// scanFields reads body as one JSON object into its fields; nil when body is not a valid JSON
// object alone (the decoder then says why).
func scanFields(body []byte) map[string]json.RawMessage {
	if !stdjson.Valid(body) {
		return nil
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil
	}
	return scanObject(body, i)
}

// scanObject reads the object at b[i] (b valid JSON) into a map of its keys' raw values.
func scanObject(b []byte, i int) map[string]json.RawMessage {
	m := make(map[string]json.RawMessage, countKeys(b, i))
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return m // '}'
		}
		ke := stringEnd(b, i+1)
		key := internKey(b[i+1 : ke])
		vs := skipSpace(b, skipSpace(b, ke+1)+1) // past the ':'
		ve := skipValue(b, vs)
		m[key] = b[vs:ve:ve]
		i = skipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// countKeys counts the keys of the object at b[i] (b valid JSON): the map's size.
func countKeys(b []byte, i int) int {
	n := 0
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return n
		}
		n++
		i = skipValue(b, skipSpace(b, skipSpace(b, skipValue(b, i))+1))
		i = skipSpace(b, i)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// scanMessages reads chat messages (raw is valid JSON: part of a checked body) as the decoder
// reads them into []map[string]json.RawMessage: an array of objects, a null element being a
// nil map. false for anything else.
func scanMessages(raw []byte) ([]map[string]json.RawMessage, bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, isNull(raw) // null decodes to no messages
	}
	n := 0
	for j := skipSpace(raw, i+1); j < len(raw) && raw[j] != ']'; {
		n++
		j = skipSpace(raw, skipValue(raw, j))
		if j < len(raw) && raw[j] == ',' {
			j = skipSpace(raw, j+1)
		}
	}
	out := make([]map[string]json.RawMessage, 0, n)
	i = skipSpace(raw, i+1)
	for i < len(raw) && raw[i] != ']' {
		switch raw[i] {
		case '{':
			out = append(out, scanObject(raw, i))
		case 'n':
			out = append(out, nil)
		default:
			return nil, false
		}
		i = skipSpace(raw, skipValue(raw, i))
		if i < len(raw) && raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
	}
	return out, true
}

// decodeString decodes a JSON string value into s as json.Unmarshal does (null leaves s alone);
// false where Unmarshal fails. A string without escapes is copied out directly.
func decodeString(raw []byte, s *string) bool {
	if n := len(raw); n >= 2 && raw[0] == '"' && raw[n-1] == '"' && plainString(raw[1:n-1]) {
		if v, ok := interned[string(raw[1:n-1])]; ok { // a role, most often: no copy
			*s = v
			return true
		}
		*s = string(raw[1 : n-1])
		return true
	}
	v, ok := unmarshalString(raw)
	if ok && v != nil {
		*s = *v
	}
	return ok
}

// plainString: no escapes, quotes or control characters (the decoder's cases).
func plainString(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == '\\' || c == '"' {
			return false
		}
	}
	return true
}

// The unmarshal helpers keep the decoder's pointer (which escapes) out of their callers' frames.
func unmarshalString(raw []byte) (*string, bool) {
	var v *string
	return v, json.Unmarshal(raw, &v) == nil
}

func unmarshalBool(raw []byte) (*bool, bool) {
	var v *bool
	return v, json.Unmarshal(raw, &v) == nil
}

func unmarshalInt(raw []byte) (*int, bool) {
	var v *int
	return v, json.Unmarshal(raw, &v) == nil
}

// decodeBool is json.Unmarshal into a bool.
func decodeBool(raw []byte, b *bool) bool {
	switch string(raw) {
	case "true":
		*b = true
		return true
	case "false":
		*b = false
		return true
	}
	v, ok := unmarshalBool(raw)
	if ok && v != nil {
		*b = *v
	}
	return ok
}

// decodeInt is json.Unmarshal into an int; plain digits are read directly.
func decodeInt(raw []byte, n *int) bool {
	if len(raw) > 0 && len(raw) <= 18 && (raw[0] != '0' || len(raw) == 1) {
		v, digits := 0, true
		for _, c := range raw {
			if c < '0' || c > '9' {
				digits = false
				break
			}
			v = v*10 + int(c-'0')
		}
		if digits {
			*n = v
			return true
		}
	}
	v, ok := unmarshalInt(raw)
	if ok && v != nil {
		*n = *v
	}
	return ok
}
