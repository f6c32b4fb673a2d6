package reply

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A JSON reader and writer for engine replies, on the hot path of every reply and event: one
// pass that builds the value the scanner walks (objects as map[string]any, arrays as []any,
// numbers as json.Number, exactly as encoding/json with UseNumber builds them) and notes values
// hidden behind a duplicate key, and a writer of that value in canonical form (keys sorted, no
// HTML escaping, invalid UTF-8 as U+FFFD, as encoding/json writes it). Both are tested against
// encoding/json.

var errJSONDepth = errors.New("JSON nested too deeply")

type jsonReader struct {
	b        []byte
	i        int
	shadowed []any
	// spend, when set, is asked before the reader allocates (upstream.max_buffered_bytes);
	// owed is what small values cost since it was last asked.
	spend func(int64) bool
	owed  int64
}

// ErrBudget: the reply does not fit in upstream.max_buffered_bytes.
var ErrBudget = errors.New("reply over the buffered-reply budget")

// What decoded values cost beyond their bytes (Go's layouts, with the garbage that growing
// slices and maps leaves until the next collection): an interface or string header, an array
// element, a map entry and an empty map.
const (
	costValue    = 16
	costElem     = 2 * 16
	costMapEntry = 96
	costMap      = 320
)

// owe accounts n bytes about to be allocated; small amounts are asked for in batches.
func (r *jsonReader) owe(n int64) error {
	if r.spend == nil {
		return nil
	}
	r.owed += n
	if r.owed < 64<<10 {
		return nil
	}
	n, r.owed = r.owed, 0
	if !r.spend(n) {
		return ErrBudget
	}
	return nil
}

func (r *jsonReader) errorf(format string, a ...any) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", r.i, fmt.Sprintf(format, a...))
}

func (r *jsonReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

func (r *jsonReader) value(depth int) (any, error) {
	r.space()
	if r.i >= len(r.b) {
		return nil, r.errorf("unexpected end")
	}
	switch c := r.b[r.i]; {
	case c == '{':
		if depth >= maxDepth {
			return nil, errJSONDepth
		}
		r.i++
		if err := r.owe(costMap); err != nil {
			return nil, err
		}
		m := map[string]any{}
		r.space()
		if r.i < len(r.b) && r.b[r.i] == '}' {
			r.i++
			return m, nil
		}
		for {
			r.space()
			if r.i >= len(r.b) || r.b[r.i] != '"' {
				return nil, r.errorf("want a string key")
			}
			k, err := r.str()
			if err != nil {
				return nil, err
			}
			r.space()
			if r.i >= len(r.b) || r.b[r.i] != ':' {
				return nil, r.errorf("want ':'")
			}
			r.i++
			v, err := r.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if old, dup := m[k]; dup {
				r.shadowed = append(r.shadowed, k, old)
			}
			if err := r.owe(costMapEntry); err != nil {
				return nil, err
			}
			m[k] = v
			r.space()
			if r.i >= len(r.b) {
				return nil, r.errorf("unexpected end in an object")
			}
			if r.b[r.i] == ',' {
				r.i++
				continue
			}
			if r.b[r.i] == '}' {
				r.i++
				return m, nil
			}
			return nil, r.errorf("want ',' or '}'")
		}
	case c == '[':
		if depth >= maxDepth {
			return nil, errJSONDepth
		}
		r.i++
		a := []any{}
		r.space()
		if r.i < len(r.b) && r.b[r.i] == ']' {
			r.i++
			return a, nil
		}
		for {
			v, err := r.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if err := r.owe(costElem); err != nil {
				return nil, err
			}
			a = append(a, v)
			r.space()
			if r.i >= len(r.b) {
				return nil, r.errorf("unexpected end in an array")
			}
			if r.b[r.i] == ',' {
				r.i++
				continue
			}
			if r.b[r.i] == ']' {
				r.i++
				return a, nil
			}
			return nil, r.errorf("want ',' or ']'")
		}
	case c == '"':
		return r.str()
	case c == 't':
		return true, r.lit("true")
	case c == 'f':
		return false, r.lit("false")
	case c == 'n':
		return nil, r.lit("null")
	case c == '-' || c >= '0' && c <= '9':
		return r.num()
	}
	return nil, r.errorf("unexpected %q", r.b[r.i])
}

func (r *jsonReader) lit(s string) error {
	if len(r.b)-r.i < len(s) || string(r.b[r.i:r.i+len(s)]) != s {
		return r.errorf("bad literal")
	}
	r.i += len(s)
	return nil
}

// num reads a number per RFC 8259's grammar, kept as its text.
func (r *jsonReader) num() (any, error) {
	s := r.i
	end, ok := numberEnd(r.b, r.i)
	r.i = end
	if !ok {
		return nil, r.errorf("bad number")
	}
	if err := r.owe(int64(r.i-s) + costValue); err != nil {
		return nil, err
	}
	return json.Number(r.b[s:r.i]), nil
}

// numberEnd reads the number at b[i] (a '-' or a digit) per RFC 8259's grammar: where it ends,
// or where it went wrong and false. Both readers of this package use it.
func numberEnd(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return i, false
		}
	}
	return i, true
}

// str reads a string, escapes resolved the way encoding/json resolves them (a lone surrogate
// or invalid UTF-8 becomes U+FFFD). What it allocates is accounted before it allocates it.
func (r *jsonReader) str() (string, error) {
	r.i++ // the opening quote
	s := r.i
	for r.i < len(r.b) { // fast path: no escapes, ASCII or valid UTF-8
		c := r.b[r.i]
		if c == '"' {
			raw := r.b[s:r.i]
			r.i++
			if !utf8.Valid(raw) {
				if err := r.owe(2*int64(validUTF8Len(raw)) + costValue); err != nil {
					return "", err
				}
				return toValidUTF8(raw), nil // invalid bytes become U+FFFD
			}
			if err := r.owe(int64(len(raw)) + costValue); err != nil {
				return "", err
			}
			return string(raw), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		r.i++
	}
	// The decoded string is never longer than its escaped form: one buffer of that size, and
	// the string made from it.
	span := len(r.b) - s
	for j := r.i; j < len(r.b); j++ {
		if r.b[j] == '\\' {
			j++
		} else if r.b[j] == '"' {
			span = j - s
			break
		}
	}
	if err := r.owe(2*int64(span) + costValue); err != nil {
		return "", err
	}
	buf := append(make([]byte, 0, span), r.b[s:r.i]...)
	for r.i < len(r.b) {
		c := r.b[r.i]
		switch {
		case c == '"':
			r.i++
			if !utf8.Valid(buf) {
				if err := r.owe(2 * int64(validUTF8Len(buf))); err != nil {
					return "", err
				}
				return toValidUTF8(buf), nil
			}
			return string(buf), nil
		case c < 0x20:
			return "", r.errorf("control character in a string")
		case c == '\\':
			if r.i+1 >= len(r.b) {
				return "", r.errorf("unexpected end in a string")
			}
			e := r.b[r.i+1]
			r.i += 2
			switch e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				u, ok := r.hex4()
				if !ok {
					return "", r.errorf("bad \\u escape")
				}
				ru := rune(u)
				if utf16.IsSurrogate(ru) {
					ru = utf8.RuneError
					if r.i+1 < len(r.b) && r.b[r.i] == '\\' && r.b[r.i+1] == 'u' {
						save := r.i
						r.i += 2
						if u2, ok := r.hex4(); ok {
							if d := utf16.DecodeRune(rune(u), rune(u2)); d != utf8.RuneError {
								ru = d
							} else {
								r.i = save // not a pair: the second escape stands alone
							}
						} else {
							return "", r.errorf("bad \\u escape")
						}
					}
				}
				buf = utf8.AppendRune(buf, ru)
			default:
				return "", r.errorf("bad escape")
			}
		default:
			buf = append(buf, c)
			r.i++
		}
	}
	return "", r.errorf("unterminated string")
}

// validUTF8Len is the length of b with every invalid byte replaced by U+FFFD (3 bytes).
func validUTF8Len(b []byte) int {
	n := 0
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			n += 3
		} else {
			n += size
		}
		i += size
	}
	return n
}

// toValidUTF8 is string([]rune(string(b))) (each invalid byte becomes U+FFFD) without the
// rune slice, four times the text's size.
func toValidUTF8(b []byte) string {
	out := make([]byte, 0, validUTF8Len(b))
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return string(out)
}

func (r *jsonReader) hex4() (uint16, bool) {
	if len(r.b)-r.i < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(r.b[r.i:r.i+4]), 16, 16)
	if err != nil {
		return 0, false
	}
	r.i += 4
	return uint16(v), true
}

// decodeStrict decodes exactly one JSON value from an engine. Values hidden behind a later
// duplicate key are returned in shadowed, so the caller can scan them before it refuses the
// reply (parsers disagree on which value wins); anything after the value is an error.
func DecodeStrict(b []byte) (v any, shadowed []any, err error) {
	return DecodeStrictSpending(b, nil)
}

// decodeStrictSpending is decodeStrict asking spend (when not nil) before it allocates: a
// refusal ends the decoding with ErrBudget.
func DecodeStrictSpending(b []byte, spend func(int64) bool) (v any, shadowed []any, err error) {
	r := &jsonReader{b: b, spend: spend}
	v, err = r.value(0)
	if err != nil {
		return nil, r.shadowed, err
	}
	r.space()
	if r.i != len(b) {
		return nil, r.shadowed, errTrailing
	}
	if len(r.shadowed) > 0 {
		return v, r.shadowed, errDuplicateKey
	}
	return v, nil, nil
}

// canonicalJSON serialises a decoded value: keys sorted, one per object, valid UTF-8, no HTML
// escaping (byte for byte what encoding/json's Encoder writes with SetEscapeHTML(false)).
func CanonicalJSON(v any) []byte {
	return AppendJSON(make([]byte, 0, 256), v)
}

func AppendJSON(b []byte, v any) []byte {
	switch t := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, t)
	case json.Number:
		if t == "" {
			return append(b, '0')
		}
		return append(b, t...)
	case string:
		return appendString(b, t)
	case []any:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSON(b, e)
		}
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = AppendJSON(b, t[k])
		}
		return append(b, '}')
	case int:
		return strconv.AppendInt(b, int64(t), 10)
	}
	// Values built by the gateway itself (flush events) use only the kinds above; anything else
	// goes through encoding/json.
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return append(b, raw...)
}

const hexDigits = "0123456789abcdef"

func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonLen is len(CanonicalJSON(v)), computed without writing it, so the output of a large
// reply is allocated once at its size (and charged before it is).
func JSONLen(v any) int {
	switch t := v.(type) {
	case nil:
		return 4
	case bool:
		if t {
			return 4
		}
		return 5
	case json.Number:
		if t == "" {
			return 1
		}
		return len(t)
	case string:
		return stringLen(t)
	case []any:
		n := 2 + max(len(t)-1, 0)
		for _, e := range t {
			n += JSONLen(e)
		}
		return n
	case map[string]any:
		n := 2 + max(len(t)-1, 0)
		for k, e := range t {
			n += stringLen(k) + 1 + JSONLen(e)
		}
		return n
	case int:
		return len(strconv.AppendInt(nil, int64(t), 10))
	}
	return len(AppendJSON(nil, v))
}

// stringLen is the length appendString writes for s.
func stringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c >= 0x20 && c != '"' && c != '\\':
				n++
			case c == '"', c == '\\', c == '\n', c == '\r', c == '\t', c == '\b', c == '\f':
				n += 2
			default:
				n += 6
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}
