package request

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	json "github.com/goccy/go-json"

	"github.com/kvgate/kvgate/apierr"
)

// Go's JSON decoders (encoding/json and goccy alike) match struct fields case-insensitively and
// keep the last of duplicate keys; Python engines match exactly, and other parsers keep the first.
// A body in which two keys of one object are equal under case folding can therefore be counted
// on one reading and served on another ("text":"<long>","TEXT":"hi"). checkKeys refuses such
// bodies before anything decodes them into structs.

// keyFrame is one open object or array while scanning.
type keyFrame struct {
	obj bool
	idx int    // arrays: index of the current element
	key []byte // objects: raw (still escaped) bytes of the current key, for error paths
	// start is where this object's keys begin in the scan's key list (raw bytes, shared by
	// every open frame: a closed frame's keys are dropped); big maps them case-folded once
	// there are many (logit_bias can be large).
	start int
	big   map[string]int
}

// keyMapAt is how many keys an object holds before lookups switch from a scan to a map.
const keyMapAt = 16

// maxKeyDepth bounds nesting: no request field needs more, and the stack is per request.
const maxKeyDepth = 256

// checkKeys scans body once, without decoding values, and refuses (400, naming the field path)
// a key that repeats, exactly or up to case, within one object at any depth. body must be valid
// UTF-8; malformed JSON is left to the decoder, which reports it better. Keys are compared in
// place (no copy) unless escaped or non-ASCII, so a small request costs no allocation here.
func CheckKeys(body []byte) *apierr.Error {
	var stackBuf [16]keyFrame
	var rawBuf [64][]byte
	stack, raws := stackBuf[:0], rawBuf[:0]
	i, n := 0, len(body)
	for i < n {
		c := body[i]
		switch c {
		case '{', '[':
			if len(stack) >= maxKeyDepth {
				return apierr.BadRequest(keyPath(stack), fmt.Sprintf("The request body nests deeper than %d levels.", maxKeyDepth))
			}
			stack = append(stack, keyFrame{obj: c == '{', start: len(raws)})
			i++
		case '}', ']':
			if len(stack) == 0 {
				return nil
			}
			raws = raws[:stack[len(stack)-1].start]
			stack = stack[:len(stack)-1]
			i++
		case ',':
			if len(stack) > 0 && !stack[len(stack)-1].obj {
				stack[len(stack)-1].idx++
			}
			i++
		case '"':
			end := stringEnd(body, i+1)
			if end < 0 {
				return nil // unterminated: the decoder refuses it
			}
			raw := body[i+1 : end]
			i = end + 1
			// A string is a key when it sits in an object and a ':' follows.
			j := i
			for j < n && isJSONSpace(body[j]) {
				j++
			}
			if len(stack) == 0 || !stack[len(stack)-1].obj || j >= n || body[j] != ':' {
				continue
			}
			f := &stack[len(stack)-1]
			f.key = raw
			var e *apierr.Error
			if raws, e = f.add(raw, raws, stack); e != nil {
				return e
			}
			i = j + 1
		default:
			i++
		}
	}
	return nil
}

// stringEnd returns the index of the quote closing the string whose content starts at i, or -1.
// A quote is escaped exactly when an odd number of backslashes precede it.
func stringEnd(b []byte, i int) int {
	for {
		q := indexByteFrom(b, i, '"')
		if q < 0 {
			return -1
		}
		bs := 0
		for k := q - 1; k >= i && b[k] == '\\'; k-- {
			bs++
		}
		if bs%2 == 0 {
			return q
		}
		i = q + 1
	}
}

func indexByteFrom(b []byte, i int, c byte) int {
	if i >= len(b) {
		return -1
	}
	if k := bytes.IndexByte(b[i:], c); k >= 0 {
		return i + k
	}
	return -1
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// add records a key of the frame in raws (the scan's key list), refusing a repeat.
func (f *keyFrame) add(raw []byte, raws [][]byte, stack []keyFrame) ([][]byte, *apierr.Error) {
	prev := -1
	if f.big != nil {
		if k, ok := f.big[foldKey(raw)]; ok {
			prev = k
		}
	} else {
		for k := f.start; k < len(raws); k++ {
			if sameKey(raws[k], raw) {
				prev = k
				break
			}
		}
	}
	if prev >= 0 {
		first, second := unescapeKey(raws[prev]), unescapeKey(raw)
		path := keyPath(stack)
		where := "the request body"
		if path != "" {
			where = path
		}
		if first == second {
			return raws, apierr.BadRequest(joinPath(path, second), fmt.Sprintf("Duplicate key %q in %s: a JSON object may name a field only once (parsers disagree on which value wins).", second, where))
		}
		return raws, apierr.BadRequest(joinPath(path, second), fmt.Sprintf("Keys %q and %q in %s differ only in letter case: engines match keys exactly, so they are refused.", first, second, where))
	}
	raws = append(raws, raw)
	if f.big != nil {
		f.big[foldKey(raw)] = len(raws) - 1
	} else if len(raws)-f.start > keyMapAt {
		f.big = make(map[string]int, 2*keyMapAt)
		for k := f.start; k < len(raws); k++ {
			f.big[foldKey(raws[k])] = k
		}
	}
	return raws, nil
}

// sameKey: a and b (raw keys) fold to the same key (foldKey), compared in place when both are
// plain ASCII.
func sameKey(a, b []byte) bool {
	if plainKey(a) && plainKey(b) {
		if len(a) != len(b) {
			return false
		}
		for k := range a {
			x, y := a[k], b[k]
			if 'A' <= x && x <= 'Z' {
				x += 'a' - 'A'
			}
			if 'A' <= y && y <= 'Z' {
				y += 'a' - 'A'
			}
			if x != y {
				return false
			}
		}
		return true
	}
	return foldKey(a) == foldKey(b)
}

// plainKey: ASCII without escapes (its folded form is its lower case).
func plainKey(raw []byte) bool {
	for _, c := range raw {
		if c >= utf8.RuneSelf || c == '\\' {
			return false
		}
	}
	return true
}

// keyPath renders the path of the innermost open container, e.g. messages[0].content[1]. The
// frame passed as stack's last element is the container; its parents supply the keys.
func keyPath(stack []keyFrame) string {
	var b strings.Builder
	for d := 0; d < len(stack)-1; d++ {
		f := &stack[d]
		if f.obj {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(unescapeKey(f.key))
		} else {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(f.idx))
			b.WriteByte(']')
		}
	}
	return b.String()
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// unescapeKey decodes a raw key as the engine will read it (escapes resolved).
func unescapeKey(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	var s string
	if err := json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s); err != nil {
		return string(raw)
	}
	return s
}

// foldKey maps a raw key to a canonical form under which keys that Go's decoders would treat
// as the same field compare equal: escapes resolved, then Unicode simple case folding (so the
// Kelvin sign K folds with k, as it does in encoding/json).
func foldKey(raw []byte) string {
	ascii := true
	for _, c := range raw {
		if c >= utf8.RuneSelf || c == '\\' {
			ascii = false
			break
		}
	}
	if ascii {
		b := make([]byte, len(raw))
		for k, c := range raw {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b[k] = c
		}
		return string(b)
	}
	s := unescapeKey(raw)
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		b.WriteRune(foldRune(r))
	}
	return b.String()
}

// foldRune is one representative of r's simple case-folding orbit (the lower case of its
// smallest member, so that it agrees with the ASCII fast path).
func foldRune(r rune) rune {
	m := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		m = min(m, f)
	}
	return unicode.ToLower(m)
}
