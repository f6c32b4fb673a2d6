package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"
)

// ---- polymorphic JSON fields ----

// ErrBadRequest wraps every parse error: the request is refused with 400.
var ErrBadRequest = errors.New("bad request")

// Badf is a bad-request error; its message follows "bad request: ".
func Badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

// IsNull reports whether raw is absent or null.
func IsNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// IsArray reports whether raw is a JSON array.
func IsArray(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '['
}

// Strings decodes a string or a list of strings.
func Strings(raw json.RawMessage, field string) ([]string, bool, error) {
	if IsNull(raw) {
		return nil, false, nil
	}
	if IsArray(raw) {
		var v []string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, true, Badf("%s: want a string or a list of strings", field)
		}
		return v, true, nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false, Badf("%s: want a string or a list of strings", field)
	}
	return []string{v}, false, nil
}

// IDLists decodes a list of ids or a list of lists.
func IDLists(raw json.RawMessage, field string) ([][]uint32, bool, error) {
	if IsNull(raw) {
		return nil, false, nil
	}
	var one []uint32
	if err := json.Unmarshal(raw, &one); err == nil {
		return [][]uint32{one}, false, nil
	}
	var many [][]uint32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, false, Badf("%s: want a list of token ids or a list of lists", field)
	}
	return many, true, nil
}

// WriteJSON answers v as JSON (500 when it cannot be encoded).
func WriteJSON(ctx *fasthttp.RequestCtx, v any) {
	b, err := Marshal(v)
	if err != nil {
		ctx.SetStatusCode(500)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// Marshal encodes JSON as Python's json does for these replies: no HTML
// escaping of <, > and &, so chat-template text reads as sent.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return b[:len(b)-1], nil
}
