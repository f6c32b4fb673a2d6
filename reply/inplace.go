package reply

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"unsafe"

	"github.com/kvgate/kvgate/internal/sse"
	"github.com/kvgate/kvgate/request"
)

// The streamed event's fast path: an event whose bytes are canonical (canon.go) and whose shape
// needs nothing of the slow path is scanned in place, string by string, by the same scanners
// per field path, and the engine's own bytes go to the client; a string the scanners changed
// (held or withheld text, a stripped own marker) is written anew in its place, so the client
// decodes exactly the values the scanners emitted. Nothing is allocated per event once the
// stream's buffers (below) have grown.
//
// Buffers, all owned by one Stream and used only on its goroutine: canon (the event's tokens),
// path (the field path being read), unesc (a string's decoded escapes), reps and repBuf (the
// strings written anew, for the event being emitted). The guard's own buffers (buf, buf2,
// joinIn, joinBuf, oneIn, oneBuf) hold its scanners' output only until its next call.

// fastState is a stream's buffers for the fast path.
type fastState struct {
	canon  canonReader
	path   []byte
	unesc  []byte
	reps   []fastRep
	repBuf []byte
	// clean are keys and values that are not plain (finish_reason, chat.completion.chunk) whose
	// stateless scan changed nothing and found nothing (scanClean), at most 256 of 256 bytes.
	clean map[string]bool
	// keys and strs are what the last events found at each place among their keys and their
	// strings: a stream's events share one shape, so a key found clean (a key's scan has no
	// state) and a field's scanners are found again by comparing bytes, not by hashing. Both
	// keep their bytes end to end in one buffer (keyBuf, pathBuf; keyEnd and strs[i].end say
	// where each ends), so a stream adds no allocation per key or field; a difference at some
	// place drops what was kept from there on.
	keyBuf  []byte
	keyEnd  ends
	pathBuf []byte
	strs    []strSlot
	spare   strSlot // the slot of a string past maxStrSlots
	nstr    int     // strings read in this event
}

// strSlot is what the fast path remembers of the string at one place in an event: its field
// path (pathBuf up to end), the path's scanners in the stream's guard, whether the path names
// main text, and a short value of it whose stateless scan left it as it is (clean[:clen]; clen
// -1: none), found again without hashing it.
type strSlot struct {
	end   int32
	main  bool
	clen  int8
	f     *fieldScan
	clean [32]byte
}

// maxStrSlots bounds the keys and strings of an event that are kept.
const maxStrSlots = 64

// replyIDField is the one key of replyIDFields (TestFastPathRefusesWithheldKeys holds them
// equal), compared without hashing.
const replyIDField = "output_ids"

// fastRep is a string token whose scanned text differs from the engine's: repBuf[from:to] is
// its JSON form (quotes included).
type fastRep struct {
	tok      int32
	from, to int
}

// fastEligible says the event read into c needs nothing the slow path does besides scanning
// strings and keys: a top-level object; no usage section (settlement reads it from the decoded
// value); no key that is withheld or changes how its value is scanned (token ids, logprobs and
// byte arrays); not an event that closes a block (held text is released before it); not
// /generate (cumulative text).
func fastEligible(c *canonReader, gd *Guard, name string) bool {
	if len(c.toks) == 0 || c.toks[0].kind != '{' {
		return false
	}
	if gd != nil && gd.sc.Kind == request.Generate {
		return false
	}
	if name != "" && (blockEnd[name] || !inert(name)) {
		return false
	}
	if !plainKeys(c) {
		return false
	}
	c.top = topMembers{-1, -1, -1, -1, -1, -1, -1}
	for i := int32(1); c.toks[i].kind == 'k'; i = c.next(i + 1) { // the top-level members
		k, v := c.toks[i], c.toks[i+1]
		switch string(c.b[k.s:k.e]) {
		case "index":
			c.top.index = i + 1
		case "output_index":
			c.top.outputIndex = i + 1
		case "content_index":
			c.top.contentIndex = i + 1
		case "choices":
			c.top.choices = i + 1
		case "delta":
			c.top.delta = i + 1
		case "text":
			c.top.text = i + 1
		case "usage":
			if !(v.kind == 'l' && c.b[v.s] == 'n') {
				return false
			}
		case "response", "message", "meta_info":
			return false
		case "type":
			if v.kind == 's' && (v.esc || blockEnd[string(c.b[v.s:v.e])]) {
				return false
			}
			c.top.typ = i + 1
		}
	}
	return true
}

// plainKeys: no key that is withheld or changes how its value is scanned (token ids, logprobs
// and byte arrays, walk's special cases).
func plainKeys(c *canonReader) bool {
	for _, i := range c.special { // (canonReader.key notes every key that may matter here)
		k := c.toks[i]
		key := c.b[k.s:k.e]
		ks := unsafe.String(unsafe.SliceData(key), len(key)) // read only
		v := c.toks[i+1]
		switch {
		case ks == replyIDField || tupleIDFields(ks):
			return false
		case strings.Contains(ks, "logprobs") && !(v.kind == 'l' && c.b[v.s] == 'n'):
			return false // a sequence: its items are scanned each on their own (walk's seq)
		case ks == "bytes" && v.kind == '[':
			return false
		}
	}
	return true
}

// member is the token of obj's member name (obj an object's token), -1 when absent.
func (c *canonReader) member(obj int32, name string) int32 {
	for i := obj + 1; c.toks[i].kind == 'k'; i = c.next(i + 1) {
		if k := c.toks[i]; string(c.b[k.s:k.e]) == name {
			return i + 1
		}
	}
	return -1
}

// next is the token after the value at v.
func (c *canonReader) next(v int32) int32 {
	if k := c.toks[v].kind; k == '{' || k == '[' {
		return c.toks[v].end + 1
	}
	return v + 1
}

func (c *canonReader) nonEmptyString(v int32) bool {
	return v >= 0 && c.toks[v].kind == 's' && c.toks[v].e > c.toks[v].s
}

func (c *canonReader) isObject(v int32) bool { return v >= 0 && c.toks[v].kind == '{' }

// carriesText is backends.CarriesText read in place (an event carries generated text: what a
// stream without usage is charged by), after fastEligible; TestCarriesTextInPlace holds the two
// equal.
func (c *canonReader) carriesText() bool {
	if t := c.top.typ; t >= 0 && c.toks[t].kind == 's' && c.toks[t].e > c.toks[t].s {
		// (An escaped type takes the slow path: fastEligible.)
		typ := string(c.b[c.toks[t].s:c.toks[t].e])
		switch {
		case typ == "content_block_delta":
			d := c.top.delta
			return c.isObject(d) && (c.nonEmptyString(c.member(d, "text")) || c.nonEmptyString(c.member(d, "thinking")) ||
				c.nonEmptyString(c.member(d, "partial_json")))
		case strings.HasPrefix(typ, "response.") && strings.HasSuffix(typ, ".delta"):
			return c.nonEmptyString(c.top.delta)
		}
		return false
	}
	if cs := c.top.choices; cs >= 0 && c.toks[cs].kind == '[' {
		for el := cs + 1; el < c.toks[cs].end; el = c.next(el) {
			if !c.isObject(el) {
				continue
			}
			if c.nonEmptyString(c.member(el, "text")) {
				return true
			}
			d := c.member(el, "delta")
			if !c.isObject(d) {
				continue
			}
			if c.nonEmptyString(c.member(d, "content")) || c.nonEmptyString(c.member(d, "reasoning_content")) {
				return true
			}
			if tc := c.member(d, "tool_calls"); tc >= 0 && c.toks[tc].kind == '[' && c.toks[tc].end > tc+1 {
				return true
			}
		}
		return false
	}
	return c.nonEmptyString(c.top.text)
}

// topMembers are the value tokens of the top-level object's members the fast path reads
// (fastEligible notes them; -1: absent).
type topMembers struct{ index, choices, delta, text, typ, outputIndex, contentIndex int32 }

// topBytes is the text of a top-level member's value token (nil when absent).
func (c *canonReader) topBytes(v int32) []byte {
	if v < 0 {
		return nil
	}
	return c.b[c.toks[v].s:c.toks[v].e]
}

// emitFast takes the fast path for ev when it may; false: nothing was done (no scanner was fed),
// the slow path takes the event.
func (e *Stream) emitFast(ev sse.Event) bool {
	if e.noFast {
		return false
	}
	f := e.fastState()
	c := &f.canon
	gd := e.o.Guard
	// A line end in the data (several data lines, joined) is JSON whitespace that would break
	// the client's framing if passed on: such an event is written anew.
	if !c.read(ev.Data) || c.lineEnd || !fastEligible(c, gd, ev.Name) {
		return false
	}
	if gd != nil {
		// Keys first, before anything is fed: a key the scanner would change (a stray "KVG-", a
		// stripped own marker) sends the event down the slow path, which replaces it in its
		// object; a key's scan has no state, and one found clean is not scanned again in this
		// stream.
		for nk, i := range c.keyToks {
			k := c.toks[i]
			kb := c.b[k.s:k.e]
			if nk < len(f.keyEnd) && bytes.Equal(f.keyBuf[f.keyEnd.start(nk):f.keyEnd[nk]], kb) {
				continue // the last event's key at this place, found clean there
			}
			switch _, ok, same := e.scanClean(gd, kb); {
			case !ok:
				e.passed(c)
				e.cut()
				return true
			case !same:
				return false
			}
			if nk <= len(f.keyEnd) && nk < maxStrSlots { // (every earlier key is kept)
				if f.keyEnd == nil {
					f.keyBuf, f.keyEnd = make([]byte, 0, 256), make(ends, 0, 32)
				}
				f.keyEnd = f.keyEnd[:nk]
				f.keyBuf = append(f.keyBuf[:f.keyEnd.start(nk)], kb...)
				f.keyEnd = append(f.keyEnd, int32(len(f.keyBuf)))
			}
		}
	}
	e.passed(c)
	f.reps, f.repBuf, f.path, f.nstr = f.reps[:0], f.repBuf[:0], f.path[:0], 0
	if gd != nil {
		if idx := c.top.index; idx >= 0 && gd.sc.Kind == request.Messages {
			if n := c.b[c.toks[idx].s:c.toks[idx].e]; string(n) != string(gd.lastBlock) {
				gd.lastBlock = json.Number(n) // where held text of a content block goes back
			}
		}
		if !gd.textOff {
			gd.setItem(c.topBytes(c.top.index), c.topBytes(c.top.outputIndex), c.topBytes(c.top.contentIndex))
		}
		if !e.scanFast(gd, 0) {
			if gd.malformed && gd.leak == nil {
				e.Fail("upstream_bad_event", ErrMalformed)
				return true
			}
			e.cut()
			return true
		}
	}
	if ev.Name != "" {
		e.out = append(append(append(e.out, "event: "...), ev.Name...), '\n')
	}
	e.out = append(e.out, "data: "...)
	at := int32(0) // the engine's bytes up to here are out
	for _, r := range f.reps {
		t := c.toks[r.tok]
		e.out = append(e.out, ev.Data[at:t.s-1]...) // up to the opening quote
		e.out = append(e.out, f.repBuf[r.from:r.to]...)
		at = t.e + 1 // after the closing quote
	}
	e.out = append(append(e.out, ev.Data[at:]...), "\n\n"...)
	e.events++
	return true
}

func (e *Stream) passed(c *canonReader) {
	if e.o.Sink != nil {
		e.o.Sink.Passed(c.carriesText())
	}
}

// scanClean is the stateless scan of one whole value (scanString: a key, or a string that is not
// text a client joins): ok false on a leak; same: the scan left it as it is. A text found clean
// is not scanned again in this stream: the scan has no state, and its verdict depends only on the
// text (an echo or own marker in it would have changed it).
func (e *Stream) scanClean(gd *Guard, b []byte) (out string, ok, same bool) {
	s := unsafe.String(unsafe.SliceData(b), len(b)) // read only
	if inert(s) || e.fast.clean[s] {
		return s, true, true
	}
	out, ok = gd.scanString(s)
	if !ok {
		return "", false, false
	}
	if out != s {
		return out, true, false
	}
	if e.fast.clean == nil {
		e.fast.clean = map[string]bool{}
	}
	if len(e.fast.clean) < 256 && len(b) <= 256 {
		e.fast.clean[string(b)] = true
	}
	return s, true, true
}

// scanFast feeds every string of the value at token v to the guard under its field path (as
// walk names paths in a stream) and notes the ones whose scanned text differs; false: the reply
// is cut.
func (e *Stream) scanFast(gd *Guard, v int32) bool {
	f := e.fast
	c := &f.canon
	switch t := c.toks[v]; t.kind {
	case 's':
		text := f.stringText(t)
		out, ok := e.scanFieldView(gd, text, f.slot(gd, f.path))
		if !ok {
			return false
		}
		if !bytes.Equal(out, text) {
			from := len(f.repBuf)
			f.repBuf = appendString(f.repBuf, unsafe.String(unsafe.SliceData(out), len(out)))
			f.reps = append(f.reps, fastRep{tok: v, from: from, to: len(f.repBuf)})
		}
	case '{':
		n := len(f.path)
		for i := v + 1; c.toks[i].kind == 'k'; i = c.next(i + 1) {
			if vk := c.toks[i+1].kind; vk == 'n' || vk == 'l' {
				continue // no string in it: no path to name
			}
			k := c.toks[i]
			f.path = append(append(f.path[:n], '.'), c.b[k.s:k.e]...)
			if !e.scanFast(gd, i+1) {
				return false
			}
		}
		f.path = f.path[:n]
	case '[':
		n := len(f.path)
		for el := v + 1; el < t.end; el = c.next(el) {
			if ek := c.toks[el].kind; ek == 'n' || ek == 'l' {
				continue
			}
			f.path = append(f.path[:n], '.')
			if et := c.toks[el]; et.kind == '{' && et.idx >= 0 {
				idx := c.toks[et.idx]
				f.path = append(append(f.path, 'i'), c.b[idx.s:idx.e]...)
			} else {
				f.path = append(f.path, '*')
			}
			if !e.scanFast(gd, el) {
				return false
			}
		}
		f.path = f.path[:n]
	}
	return true
}

// slot is the strSlot of the event's next string, at path (a view of f.path): the last event's
// when it had the same path there, else one made now (kept when every earlier one is; else
// f.spare, for this string only).
func (f *fastState) slot(gd *Guard, path []byte) *strSlot {
	n := f.nstr
	f.nstr++
	if n < len(f.strs) && bytes.Equal(f.pathBuf[f.slotStart(n):f.strs[n].end], path) {
		return &f.strs[n]
	}
	key := unsafe.String(unsafe.SliceData(path), len(path)) // field copies it when it keeps it
	sl := strSlot{f: gd.field(key), main: mainText(lastSeg(key)), clen: -1}
	if n <= len(f.strs) && n < maxStrSlots {
		if f.strs == nil {
			f.pathBuf, f.strs = make([]byte, 0, 256), make([]strSlot, 0, 16)
		}
		f.strs = f.strs[:n]
		f.pathBuf = append(f.pathBuf[:f.slotStart(n)], path...)
		sl.end = int32(len(f.pathBuf))
		f.strs = append(f.strs, sl)
		return &f.strs[n]
	}
	f.spare = sl
	return &f.spare
}

// slotStart is where the n-th slot's path begins in pathBuf.
func (f *fastState) slotStart(n int) int32 {
	if n == 0 {
		return 0
	}
	return f.strs[n-1].end
}

// ends are where byte strings kept end to end end.
type ends []int32

// start is where the n-th begins.
func (e ends) start(n int) int32 {
	if n == 0 {
		return 0
	}
	return e[n-1]
}

// scanFieldView is scanField for a streamed string (not in a sequence) on bytes it only reads:
// the result is s itself when the scanners changed nothing, else a view valid until the guard's
// next call.
func (e *Stream) scanFieldView(gd *Guard, s []byte, sl *strSlot) ([]byte, bool) {
	if !gd.afford(4 * len(s)) {
		return nil, false
	}
	if sl.main {
		return gd.feedField(sl.f, s, true)
	}
	// Detected across events by the field's scanners; cleaned on its own (scanValue).
	if _, ok := gd.feedField(sl.f, s, false); !ok {
		return nil, false
	}
	if sl.clen >= 0 && bytes.Equal(sl.clean[:sl.clen], s) {
		return s, true // the value this place had before, found clean: its scan has no state
	}
	out, ok, same := e.scanClean(gd, s)
	if !ok {
		return nil, false
	}
	if same {
		if len(s) <= len(sl.clean) {
			sl.clen = int8(copy(sl.clean[:], s))
		}
		return s, true
	}
	return unsafe.Slice(unsafe.StringData(out), len(out)), true
}

// The whole reply's fast path (BodyUsage): a canonical body is scanned in place as walk scans a
// whole body (each string as one value, under its nearest key), and its bytes go to the client,
// changed strings written anew in their place; only the members usage is read from are decoded.

// canonPool holds fast-path buffers: a Body takes one for the length of its scan and puts it
// back before it returns (nothing of it is kept: the output is the caller's text, or a new
// slice); a Stream takes one at its first event and puts it back at Release.
var canonPool = sync.Pool{New: func() any { return new(fastState) }}

// putFast gives f back to canonPool unless it grew large.
func putFast(f *fastState) {
	f.canon.b = nil
	if cap(f.canon.toks) <= 4096 {
		canonPool.Put(f)
	}
}

// fastState is the stream's fast-path buffers, taken from canonPool at its first event; what a
// stream keeps of its events (clean keys and values, field scanners by place) is its own and
// starts empty.
func (e *Stream) fastState() *fastState {
	if e.fast == nil {
		f := canonPool.Get().(*fastState)
		clear(f.clean)
		clear(f.strs[:cap(f.strs)]) // (no scanners of another guard kept alive)
		f.strs, f.keyEnd, f.nstr, f.spare = f.strs[:0], f.keyEnd[:0], 0, strSlot{}
		e.fast = f
	}
	return e.fast
}

// usageMembers are the top-level members backends' usage reader looks at (section, and a batch
// item's index): the only ones BodyUsage decodes.
var usageMembers = [...]string{"usage", "response", "message", "meta_info", "index"}

// bodyInPlace is Body's work on canonical UTF-8 text; taken false: nothing was scanned, the
// caller decodes. v is the top-level object with only its usageMembers.
func bodyInPlace(gd *Guard, text []byte, c *Charge) (out []byte, v any, leak *Hit, err error, taken bool) {
	f := canonPool.Get().(*fastState)
	defer putFast(f)
	cr := &f.canon
	if !cr.read(text) || cr.toks[0].kind != '{' || !plainKeys(cr) {
		return nil, nil, nil, nil, false
	}
	f.reps, f.repBuf = f.reps[:0], f.repBuf[:0]
	if gd != nil {
		gd.whole = true
		for i := 1; i < len(cr.toks); i++ { // keys first (stateless), as the stream does
			if k := cr.toks[i]; k.kind == 'k' {
				ks := unsafe.String(unsafe.SliceData(cr.b[k.s:k.e]), int(k.e-k.s))
				if inert(ks) {
					continue
				}
				clean, ok := gd.scanString(ks)
				if !ok {
					return bodyRefusal(gd)
				}
				if clean != ks {
					return nil, nil, nil, nil, false // the decoding path replaces the key
				}
			}
		}
		if !f.scanWhole(gd, 0, nil) || gd.flushHeld() {
			return bodyRefusal(gd)
		}
	}
	m := map[string]any{}
	for _, name := range usageMembers {
		if at := cr.member(0, name); at >= 0 {
			t := cr.toks[at]
			end := t.e
			if t.kind == '{' || t.kind == '[' {
				end = cr.toks[t.end].e
			}
			if t.kind == 's' {
				t.s, end = t.s-1, t.e+1 // the quotes
			}
			mv, _, derr := DecodeStrict(text[t.s:end])
			if derr != nil {
				return nil, nil, nil, nil, false // cannot be: the bytes are canonical
			}
			m[name] = mv
		}
	}
	if len(f.reps) == 0 {
		return text, m, nil, nil, true
	}
	n := len(text) + len(f.repBuf)
	if !c.Spend(int64(n)) {
		return nil, nil, nil, ErrBudget, true
	}
	out = make([]byte, 0, n)
	at := int32(0)
	for _, r := range f.reps {
		t := cr.toks[r.tok]
		out = append(append(out, text[at:t.s-1]...), f.repBuf[r.from:r.to]...)
		at = t.e + 1
	}
	return append(out, text[at:]...), m, nil, nil, true
}

// bodyRefusal is Body's answer once the guard refused: over budget, or a leak.
func bodyRefusal(gd *Guard) ([]byte, any, *Hit, error, bool) {
	if gd.overBudget {
		return nil, nil, nil, ErrBudget, true
	}
	return nil, nil, gd.leak, ErrLeak, true
}

// scanWhole scans every string of the value at token v as one whole value under its nearest key
// (walk's naming in a whole body: field), noting the ones the scan changed; false: refused.
func (f *fastState) scanWhole(gd *Guard, v int32, field []byte) bool {
	c := &f.canon
	switch t := c.toks[v]; t.kind {
	case 's':
		text := f.stringText(t)
		s := unsafe.String(unsafe.SliceData(text), len(text))
		fs := unsafe.String(unsafe.SliceData(field), len(field))
		out, ok := gd.scanValue(s, mainText(lastSeg(fs)))
		if !ok {
			return false
		}
		if out != s {
			from := len(f.repBuf)
			f.repBuf = appendString(f.repBuf, out)
			f.reps = append(f.reps, fastRep{tok: v, from: from, to: len(f.repBuf)})
		}
	case '{':
		for i := v + 1; c.toks[i].kind == 'k'; i = c.next(i + 1) {
			k := c.toks[i]
			if !f.scanWhole(gd, i+1, c.b[k.s:k.e]) {
				return false
			}
		}
	case '[':
		for el := v + 1; el < t.end; el = c.next(el) {
			if !f.scanWhole(gd, el, field) {
				return false
			}
		}
	}
	return true
}

// stringText is string token t's text: a view of the engine's bytes, or, when it holds escapes,
// its decoding in f.unesc (kept for the next string: valid until then).
func (f *fastState) stringText(t rawTok) []byte {
	text := f.canon.text(t, f.unesc[:0])
	if t.esc {
		f.unesc = text[:0]
	}
	return text
}
