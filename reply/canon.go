package reply

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// The in-place reading of an engine's JSON: one pass over the bytes as they came, without
// building a value, that says whether those bytes may reach the client as they are. They may
// when every reader decodes them to exactly the values the scanner reads from them:
//   - one JSON value, grammar checked (RFC 8259);
//   - no key twice in an object (parsers disagree on which value wins);
//   - strings of valid UTF-8 with no \u escape (a lone surrogate decodes three ways across
//     parsers, and an escape can spell text the scanner would see differently); the other
//     escapes (\" \\ \/ \b \f \n \r \t) mean one thing to every parser and are decoded here;
//   - every merge index (index, output_index, content_index) a canonical non-negative integer
//     (a reply that spells one index two ways is refused on the slow path, ErrMalformed).
// Anything else takes the slow path: decoded into a value, scanned, re-serialised.
//
// The tokens are kept in a slice the reader owns and reuses, so a stream reads each event with
// no allocation once the slice has grown to its events' size.

// rawTok is one token of the value, by its place in the bytes.
type rawTok struct {
	kind byte  // '{' '}' '[' ']', 'k' key, 's' string, 'n' number, 'l' literal
	esc  bool  // a key or string holds (simple) escapes: its text must be decoded
	s, e int32 // a key's or string's content without its quotes; the bytes of anything else
	// end is, for '{' and '[', the position of the matching close token; idx, for '{', the
	// position of the number token of its "index" member (-1: none)
	end, idx int32
}

// canonReader reads values in place; its buffers are reused from value to value.
type canonReader struct {
	b     []byte
	i     int
	toks  []rawTok
	open  []int32 // positions of open containers
	keys  []int32 // key tokens of the open objects, innermost last
	kbase []int32 // for each open object, where its keys start in keys
	// kseen is, for each open object, a set of its keys' (length, last byte) classes: a key is
	// compared with the earlier ones only when its class was seen
	kseen []uint64
	// special are the key tokens fastEligible looks at (token ids, logprobs, byte arrays), noted
	// as they are read so it need not look at every key
	special []int32
	// keyToks are every key token, in order
	keyToks []int32
	top     topMembers // set by fastEligible
	// lineEnd: the value has a CR or LF (whitespace, the only place a canonical value may hold
	// one), which would break an event's framing if passed on
	lineEnd bool
}

// maxCanonKeys bounds the keys of one object read in place: duplicates are found by comparing
// each key with the object's earlier ones, so a wider object takes the slow path (a map).
const maxCanonKeys = 64

// read tokenises b; true when b is one JSON value in the canonical form above.
func (c *canonReader) read(b []byte) bool {
	if len(b) > 1<<30 {
		return false
	}
	c.b, c.i, c.lineEnd = b, 0, false
	c.toks, c.open, c.keys, c.kbase, c.kseen, c.special = c.toks[:0], c.open[:0], c.keys[:0], c.kbase[:0], c.kseen[:0], c.special[:0]
	c.keyToks = c.keyToks[:0]
	if !c.value() {
		return false
	}
	c.space()
	return c.i == len(b)
}

func (c *canonReader) space() {
	b, i := c.b, c.i
	for i < len(b) {
		switch b[i] {
		case ' ', '\t':
			i++
		case '\n', '\r':
			c.lineEnd = true
			i++
		default:
			c.i = i
			return
		}
	}
	c.i = i
}

// value reads one value; containers are read iteratively (the open stack), so depth costs no
// Go stack, and is bounded like the decoder's.
func (c *canonReader) value() bool {
	for {
		c.space()
		if c.i >= len(c.b) {
			return false
		}
		switch ch := c.b[c.i]; {
		case ch == '{' || ch == '[':
			if len(c.open) >= maxDepth {
				return false
			}
			c.open = append(c.open, int32(len(c.toks)))
			c.toks = append(c.toks, rawTok{kind: ch, s: int32(c.i), idx: -1})
			c.i++
			c.space()
			if ch == '{' {
				c.kbase = append(c.kbase, int32(len(c.keys)))
				c.kseen = append(c.kseen, 0)
				if c.i < len(c.b) && c.b[c.i] == '}' {
					c.close('}')
					break
				}
				if !c.key() {
					return false
				}
			} else if c.i < len(c.b) && c.b[c.i] == ']' {
				c.close(']')
				break
			}
			continue // the first member's value
		case ch == '"':
			if _, ok := c.str('s'); !ok {
				return false
			}
		case ch == 't':
			if !c.lit("true") {
				return false
			}
		case ch == 'f':
			if !c.lit("false") {
				return false
			}
		case ch == 'n':
			if !c.lit("null") {
				return false
			}
		case ch == '-' || ch >= '0' && ch <= '9':
			if !c.num() {
				return false
			}
		default:
			return false
		}
		// A value ended: go on in the container that holds it, closing what ends here.
		for {
			if len(c.open) == 0 {
				return true
			}
			c.space()
			if c.i >= len(c.b) {
				return false
			}
			top := c.toks[c.open[len(c.open)-1]].kind
			if c.b[c.i] == ',' {
				c.i++
				if top == '{' {
					c.space()
					if !c.key() {
						return false
					}
				}
				break // the next value
			}
			if top == '{' && c.b[c.i] == '}' || top == '[' && c.b[c.i] == ']' {
				c.close(c.b[c.i])
				continue
			}
			return false
		}
	}
}

// close ends the innermost container at c.i.
func (c *canonReader) close(ch byte) {
	at := c.open[len(c.open)-1]
	c.open = c.open[:len(c.open)-1]
	if ch == '}' {
		c.keys = c.keys[:c.kbase[len(c.kbase)-1]]
		c.kbase = c.kbase[:len(c.kbase)-1]
		c.kseen = c.kseen[:len(c.kseen)-1]
	}
	c.toks[at].end = int32(len(c.toks))
	c.toks = append(c.toks, rawTok{kind: ch, s: int32(c.i), e: int32(c.i + 1)})
	c.i++
}

// key reads an object's key and its colon: no escapes in it, not a duplicate of the object's
// earlier keys, a merge index's value canonical.
func (c *canonReader) key() bool {
	if c.i >= len(c.b) || c.b[c.i] != '"' {
		return false
	}
	k, ok := c.str('k')
	if !ok || k.esc {
		return false
	}
	name := c.b[k.s:k.e]
	base := c.kbase[len(c.kbase)-1]
	if len(c.keys)-int(base) >= maxCanonKeys {
		return false
	}
	last := byte(0)
	if len(name) > 0 {
		last = name[len(name)-1]
	}
	class := uint64(1) << ((uint(len(name))*7 ^ uint(last)) & 63)
	if seen := &c.kseen[len(c.kseen)-1]; *seen&class == 0 {
		*seen |= class
	} else {
		for _, p := range c.keys[base:] {
			if o := c.toks[p]; string(c.b[o.s:o.e]) == string(name) {
				return false
			}
		}
	}
	kt := len(c.toks) - 1
	c.keys = append(c.keys, int32(kt))
	c.keyToks = append(c.keyToks, int32(kt))
	if len(name) >= 5 && (string(name) == "bytes" || len(name) >= 8 && bytes.Contains(name, []byte("logprobs")) ||
		string(name) == replyIDField) {
		c.special = append(c.special, int32(kt))
	}
	c.space()
	if c.i >= len(c.b) || c.b[c.i] != ':' {
		return false
	}
	c.i++
	if isIndexKey(name) {
		c.space()
		s := c.i
		if c.i >= len(c.b) || !c.num() || !canonicalIndexBytes(c.b[s:c.i]) {
			return false
		}
		if string(name) == "index" {
			c.toks[c.open[len(c.open)-1]].idx = int32(len(c.toks) - 1)
		}
		// The number is this key's value: the caller's loop goes on after it.
		c.i = s
		c.toks = c.toks[:len(c.toks)-1]
	}
	return true
}

// isIndexKey is indexKeys[name] without hashing.
func isIndexKey(name []byte) bool {
	switch len(name) {
	case 5:
		return string(name) == "index"
	case 12:
		return string(name) == "output_index"
	case 13:
		return string(name) == "content_index"
	}
	return false
}

// canonicalIndexBytes is canonicalIndex on a number's bytes.
func canonicalIndexBytes(n []byte) bool {
	if len(n) == 0 || len(n) > 9 || len(n) > 1 && n[0] == '0' {
		return false
	}
	for _, d := range n {
		if d < '0' || d > '9' {
			return false
		}
	}
	return true
}

// str reads a string (kind 'k' or 's') and returns its token (also appended). Its loop keeps
// the position in a register and classifies each byte by one table lookup.
func (c *canonReader) str(kind byte) (rawTok, bool) {
	b := c.b
	i := c.i + 1
	s := i
	esc, high := false, false
	for i < len(b) {
		switch strClass[b[i]] {
		case strPlain:
			i++
		case strQuote:
			if high && !utf8.Valid(b[s:i]) {
				return rawTok{}, false
			}
			t := rawTok{kind: kind, esc: esc, s: int32(s), e: int32(i)}
			c.toks = append(c.toks, t)
			c.i = i + 1
			return t, true
		case strEscape:
			if i+1 >= len(b) || strings.IndexByte(`"\/bfnrt`, b[i+1]) < 0 {
				return rawTok{}, false // \u, or not an escape at all
			}
			esc = true
			i += 2
		case strControl:
			return rawTok{}, false
		default: // strHigh
			high = true
			i++
		}
	}
	return rawTok{}, false
}

// The classes of a byte in a string (strClass).
const (
	strPlain = iota
	strQuote
	strEscape
	strControl
	strHigh
)

var strClass = func() (t [256]uint8) {
	for ch := range 256 {
		switch {
		case ch == '"':
			t[ch] = strQuote
		case ch == '\\':
			t[ch] = strEscape
		case ch < 0x20:
			t[ch] = strControl
		case ch >= utf8.RuneSelf:
			t[ch] = strHigh
		}
	}
	return t
}()

func (c *canonReader) lit(s string) bool {
	if len(c.b)-c.i < len(s) || string(c.b[c.i:c.i+len(s)]) != s {
		return false
	}
	c.toks = append(c.toks, rawTok{kind: 'l', s: int32(c.i), e: int32(c.i + len(s))})
	c.i += len(s)
	return true
}

// num reads a number per RFC 8259.
func (c *canonReader) num() bool {
	s := c.i
	end, ok := numberEnd(c.b, c.i)
	c.i = end
	if !ok {
		return false
	}
	c.toks = append(c.toks, rawTok{kind: 'n', s: int32(s), e: int32(c.i)})
	return true
}

// text is a key's or string's decoded content: the bytes themselves, or (with escapes) their
// decoding appended to scratch.
func (c *canonReader) text(t rawTok, scratch []byte) []byte {
	raw := c.b[t.s:t.e]
	if !t.esc {
		return raw
	}
	for i := 0; i < len(raw); i++ {
		ch := raw[i]
		if ch != '\\' {
			scratch = append(scratch, ch)
			continue
		}
		i++
		switch raw[i] {
		case 'b':
			ch = '\b'
		case 'f':
			ch = '\f'
		case 'n':
			ch = '\n'
		case 'r':
			ch = '\r'
		case 't':
			ch = '\t'
		default: // " \ /
			ch = raw[i]
		}
		scratch = append(scratch, ch)
	}
	return scratch
}
