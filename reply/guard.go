package reply

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/request"
)

// Scope is whose reply a Guard scans and what it may hold.
type Scope struct {
	Keyring   *canary.Keyring
	Requester string   // the tenant the reply goes to: its own marker is stripped
	Echoes    []string // foreign markers (or fragments) the requester's own prompt held
	Kind      request.Kind
	EngineRID string // the rid held text is released under (/generate)
	// Watch is told what the scan finds besides a leak, and reads the reply's text for the
	// second detector (nil: neither).
	Watch Watch
}

// Watch is what a Guard reports to (the request's leak detection, package leakwatch). Echo
// records an echoed marker (the requester's own text coming back). Reading opens one reading of
// the reply's text for the prompt-text detector, which says when the text carries another
// tenant's prompt: the joined text (the values in the order a client joins them) or, in a
// stream, one text field's (per choice, per field path, per content block or output item), as a
// client's SDK assembles them: choices interleaved word by word break every shingle of the
// joined reading but none of a choice's own. A nil reading: the watch reads no text, and is not
// asked again.
type Watch interface {
	Echo(h canary.Hit)
	Reading() TextReading
}

// TextReading reads one sequence of text as it streams; Feed returns the leak once the text so
// far is one, nil before. Fork is a copy of the reading as it stands, read on separately.
type TextReading interface {
	Feed(text string) *canary.Hit
	Fork() TextReading
}

// Guard scans one reply for canary markers, on the decoded values a client reads. Every string
// (and map key, and byte array) is scanned. In a stream, every string also goes through a
// stateful scanner of its field path, because clients concatenate what a path carries across
// events (SDKs accumulate every delta field, tool-call names and ids included): a marker split
// across events is still seen whole. /generate's cumulative text is scanned on its new suffix.
type Guard struct {
	sc     Scope
	fields map[string]*fieldScan
	order  []string // field keys in creation order, for a deterministic flush
	// generate: raw cumulative text seen so far and what was emitted of it, per index
	rawCum, outCum map[string]string
	leak           *canary.Hit
	buf, buf2      []byte
	// whole: a non-streaming body, whose strings are complete values.
	whole bool
	// lastBlock: the index of the last Anthropic content block seen in a stream
	lastBlock json.Number
	// item is the current event's merge indexes at its top level (Anthropic's content block,
	// the Responses API's output item and content part), which the field path does not name:
	// the prompt-text reading of a field is per item.
	item [3]uint32
	// joinText is the prompt-text detector's joined reading (nil until needed). While the
	// joined text so far is exactly one field reading's (a stream with one text field, the usual
	// case), that reading, aliasText, stands for it and the text is hashed once; the joined
	// reading forks from it when a second field or other joined text arrives.
	joinText, aliasText TextReading
	// textOff: the watch reads no text (none given, or its first reading was nil).
	textOff bool
	// one scans whole values (reset for each), oneIn and oneBuf its input and output buffers;
	// kit holds it with the joined reading's scanners (all three set together: takeKit)
	kit           *scanKit
	one           *canary.Loose
	oneIn, oneBuf []byte
	// spend, for a whole reply, accounts what scanning a large value allocates
	// (upstream.max_buffered_bytes); overBudget says a scan stopped because it refused.
	spend      func(int64) bool
	overBudget bool
	// malformed: the reply breaks a rule clients rely on to assemble it (an index that is not a
	// non-negative JSON integer): refused as unusable, not a leak.
	malformed bool
	// joinLoose reads every text value in emission order (joined); joinIn is its input piece;
	// joinCharged says its buffers were charged. joinStrict is the prefix scanner of the same
	// joined reading: a "K" at the end of one value and "VG-" at the start of the next are one
	// "KVG-" to the client.
	joinStrict  *canary.Scanner
	joinLoose   *canary.Loose
	joinIn      []byte
	joinBuf     []byte // the joined reading's output (its own: callers pass views of buf)
	joinCharged bool
}

// fieldScan is the stateful scan of one field path: the prefix scanner first (it strips the
// requester's own markers and redacts stray "KVG-"), then the folded-text detector on what the
// prefix scanner emits, which is what the client reads: stripping a marker joins the text
// around it, and the detector must see that join.
type fieldScan struct {
	loose  *canary.Loose
	strict *canary.Scanner
	// texts are the field's prompt-text readings by item (the event's content block or output
	// item; 0 where the path itself names the choice): made on first use, text fields only.
	texts map[[3]uint32]TextReading
}

// NewGuard is a guard for one reply; nil when canaries are off (no keyring).
func NewGuard(sc Scope) *Guard {
	if sc.Keyring == nil {
		return nil
	}
	return &Guard{sc: sc, lastBlock: "0", textOff: sc.Watch == nil} // its maps are made on first use: most replies need none
}

// scanKit is a guard's whole-value scanners (Guard.one, joinStrict, joinLoose) and their
// buffers. A whole reply's guard takes one when it first scans a value and gives it back at the
// end of Body, so a reply costs no scanner and buffer allocations once the pool is warm; a
// stream's guard keeps its kit (the joined reading runs to the stream's end).
type scanKit struct {
	k                              *canary.Keyring // the keyring its scanners read
	one, joinLoose                 *canary.Loose
	joinStrict                     *canary.Scanner
	oneIn, oneBuf, joinIn, joinBuf []byte
}

var kitPool sync.Pool

// maxKitBuffer is the largest buffer a kit goes back to the pool with: a kit that scanned a
// large value (and whose scanners' own buffers grew with it) is left to the collector.
const maxKitBuffer = 64 << 10

// takeKit gives gd its whole-value scanners, reset for its requester.
func (gd *Guard) takeKit() {
	kit, _ := kitPool.Get().(*scanKit)
	k := gd.sc.Keyring
	if kit == nil || kit.k != k {
		kit = &scanKit{k: k, one: k.NewLoose(gd.sc.Requester, gd.sc.Echoes), joinLoose: k.NewLoose(gd.sc.Requester, gd.sc.Echoes),
			joinStrict: k.NewScanner(gd.sc.Requester, gd.sc.Echoes)}
	} else {
		kit.one.Reset(gd.sc.Requester, gd.sc.Echoes)
		kit.joinLoose.Reset(gd.sc.Requester, gd.sc.Echoes)
		kit.joinStrict.Reset(gd.sc.Requester, gd.sc.Echoes)
	}
	gd.kit = kit
	gd.one, gd.joinLoose, gd.joinStrict = kit.one, kit.joinLoose, kit.joinStrict
	gd.oneIn, gd.oneBuf, gd.joinIn, gd.joinBuf = kit.oneIn[:0], kit.oneBuf[:0], kit.joinIn[:0], kit.joinBuf[:0]
}

// releaseKit gives the kit back (the whole reply is scanned): a later scan takes a fresh one.
// Nothing the guard returned is a view of the kit's buffers (scanValue and joined copy what they
// change).
func (gd *Guard) releaseKit() {
	kit := gd.kit
	if kit == nil {
		return
	}
	gd.kit, gd.one, gd.joinLoose, gd.joinStrict = nil, nil, nil, nil
	bufs := [...][]byte{gd.oneIn, gd.oneBuf, gd.joinIn, gd.joinBuf}
	gd.oneIn, gd.oneBuf, gd.joinIn, gd.joinBuf = nil, nil, nil, nil
	for _, b := range bufs {
		if cap(b) > maxKitBuffer {
			return
		}
	}
	kit.oneIn, kit.oneBuf, kit.joinIn, kit.joinBuf = bufs[0][:0], bufs[1][:0], bufs[2][:0], bufs[3][:0]
	kitPool.Put(kit)
}

func (gd *Guard) field(key string) *fieldScan {
	f := gd.fields[key]
	if f == nil {
		if gd.fields == nil {
			gd.fields = map[string]*fieldScan{}
		}
		key = strings.Clone(key) // the caller's key may be a view of a reused buffer
		k := gd.sc.Keyring
		f = &fieldScan{loose: k.NewLoose(gd.sc.Requester, gd.sc.Echoes), strict: k.NewScanner(gd.sc.Requester, gd.sc.Echoes)}
		gd.fields[key] = f
		gd.order = append(gd.order, key)
	}
	return f
}

// ScanText scans one whole text that is not passed on (a header line); it returns the first
// foreign marker found so far, or nil.
func (gd *Guard) ScanText(s string) *Hit {
	if gd.leak == nil {
		gd.scanString(s)
	}
	return gd.leak
}

// Leak is the first foreign marker found, or nil.
func (gd *Guard) Leak() *Hit { return gd.leak }

// feed scans one piece of streamed text; it returns what may be emitted now. join: the field
// is text a client joins with the reply's other text values (Guard.joined).
func (gd *Guard) feed(key, text string, join bool) (string, bool) {
	out, ok := gd.feedView(key, []byte(text), join)
	return string(out), ok
}

// feedView is feed on bytes, allocating nothing once the guard's buffers have grown: text is
// only read, and what it returns is a view of gd.buf2, valid until the guard's next call.
func (gd *Guard) feedView(key string, text []byte, join bool) ([]byte, bool) {
	// In a whole reply (logprobs items): the text's copy, two scanners' output, the string.
	if !gd.afford(4 * len(text)) {
		return nil, false
	}
	return gd.feedField(gd.field(key), text, join)
}

// feedField is feedView on the field's scanners (looked up by the caller).
func (gd *Guard) feedField(f *fieldScan, text []byte, join bool) ([]byte, bool) {
	mid, v := f.strict.Feed(gd.buf[:0], text)
	gd.buf = mid[:0]
	gd.note(v)
	if v.Leak != nil {
		return nil, false
	}
	return gd.looseStage(f, mid, join)
}

// looseStage passes what the prefix scanner emitted through the joined reading (for text a
// client joins) and the field's folded detector. The joined reading goes first, on the text as
// the field's scanners have it, so a run across values is seen whole before the field's own
// detector withholds part of it.
func (gd *Guard) looseStage(f *fieldScan, mid []byte, join bool) ([]byte, bool) {
	if join {
		aliased := false
		if r := gd.fieldText(f); r != nil {
			if h := r.Feed(unsafe.String(unsafe.SliceData(mid), len(mid))); h != nil {
				gd.noteLeak(h)
				return nil, false
			}
			if gd.joinText == nil && (gd.aliasText == nil || gd.aliasText == r) {
				gd.aliasText, aliased = r, true // the joined text so far is r's
			}
		}
		j, ok := gd.joinedRead(mid, aliased)
		if !ok {
			return nil, false
		}
		mid = j // mid itself, or the joined reading's own buffer
	}
	out, h := f.loose.Feed(gd.buf2[:0], mid)
	gd.buf2 = out[:0]
	if h != nil {
		gd.noteLeak(h)
		return nil, false
	}
	return out, true
}

// fieldText is the field's prompt-text reading for the current item (nil: no text is read, or a
// whole reply's, which has only the joined reading).
func (gd *Guard) fieldText(f *fieldScan) TextReading {
	if gd.textOff || gd.whole {
		return nil
	}
	r := f.texts[gd.item]
	if r == nil {
		if r = gd.reading(); r == nil {
			return nil
		}
		if f.texts == nil {
			f.texts = make(map[[3]uint32]TextReading, 1)
		}
		f.texts[gd.item] = r
	}
	return r
}

// reading opens a reading of the reply's text; the first nil says the watch reads none.
func (gd *Guard) reading() TextReading {
	r := gd.sc.Watch.Reading()
	gd.textOff = r == nil
	return r
}

// setItem notes the current event's top-level merge indexes (index, output_index,
// content_index), each a distinct reading: no two indexes a client keeps apart share one.
func (gd *Guard) setItem(index, outputIndex, contentIndex []byte) {
	gd.item = [3]uint32{itemIndex(index), itemIndex(outputIndex), itemIndex(contentIndex)}
}

// itemIndex reads a canonical index (at most 9 digits, canonicalIndex); anything else (absent:
// 0; not canonical: MaxUint32, and walk refuses the event) stays apart from every real one but 0.
func itemIndex(b []byte) uint32 {
	if len(b) > 9 {
		return math.MaxUint32
	}
	n := uint32(0)
	for _, c := range b {
		if c < '0' || c > '9' {
			return math.MaxUint32
		}
		n = n*10 + uint32(c-'0')
	}
	return n
}

func (gd *Guard) note(v canary.Verdict) {
	for _, e := range v.Echoes {
		if gd.sc.Watch != nil {
			gd.sc.Watch.Echo(e)
		}
	}
	if v.Leak != nil {
		gd.noteLeak(v.Leak)
	}
}

func (gd *Guard) noteLeak(h *canary.Hit) {
	if gd.leak == nil {
		gd.leak = h
	}
}

// joinedField says a stream field's text is joined by clients with the reply's other text
// (its stateful scan went through Guard.joined): a main text field fed as a stream, or
// /generate's text.
func joinedField(key string) bool {
	return strings.HasPrefix(key, "gen:") || mainText(lastSeg(key)) && !strings.Contains(key, "logprobs") && !strings.HasSuffix(key, ".#key")
}

// scanPiece is how much of a long value the folded detector is fed at a time.
const scanPiece = 1 << 20

// scanString scans a whole value and returns it cleaned: the requester's own markers stripped,
// stray "KVG-" redacted, runs of HoldMin or more characters of a foreign marker withheld.
func (gd *Guard) scanString(s string) (string, bool) { return gd.scanValue(s, false) }

// scanValue is scanString; join: the value is text a client joins with the reply's other text
// values, read by the joined detector between the prefix scanner and the value's own.
func (gd *Guard) scanValue(s string, join bool) (string, bool) {
	if inert(s) && !join {
		return s, true
	}
	k := gd.sc.Keyring
	if strings.Contains(s, "KVG") {
		// The prefix scanner's copy of the text, its output and the string made of it.
		if !gd.afford(3 * len(s)) {
			return "", false
		}
		out, v := k.ScanAll(gd.sc.Requester, gd.sc.Echoes, []byte(s))
		gd.note(v)
		if v.Leak != nil {
			return "", false
		}
		s = string(out)
	}
	if join {
		var ok bool
		if s, ok = gd.joined(s); !ok {
			return "", false
		}
	}
	if inert(s) {
		return s, true
	}
	if gd.kit == nil {
		gd.takeKit()
	}
	l := gd.one
	l.Reset(gd.sc.Requester, gd.sc.Echoes)
	// The folded detector passes text on unchanged unless it withholds a run, so it reads a long
	// value a piece at a time (cut at rune boundaries, as a stream's events are) through one
	// small buffer, and a copy of the value is made only once something in it changed: a value
	// may be a 60 MB reply.
	var changed []byte
	done := 0 // s[:done] is accounted for in changed (when changed != nil)
	var h *canary.Hit
	for i := 0; i < len(s) && h == nil; {
		j := min(len(s), i+scanPiece)
		for j < len(s) && j > i+1 && !utf8.RuneStart(s[j]) {
			j--
		}
		gd.oneIn = append(gd.oneIn[:0], s[i:j]...)
		var mid []byte
		mid, h = l.Feed(gd.oneBuf[:0], gd.oneIn)
		gd.oneBuf = mid[:0]
		changed, done = gd.keepChanges(changed, s, done, mid)
		i = j
	}
	if h == nil {
		var mid []byte
		mid, h = l.Flush(gd.oneBuf[:0])
		gd.oneBuf = mid[:0]
		changed, done = gd.keepChanges(changed, s, done, mid)
	}
	if h != nil {
		gd.noteLeak(h)
		return "", false
	}
	if gd.overBudget {
		return "", false
	}
	if changed != nil {
		return string(changed), true
	}
	return s, true
}

// keepChanges tracks the detector's output for s[i:j] (mid): while it is s itself (the
// detector emitting what it read, a partial escape held back a moment) nothing is copied; from
// the first difference on, the output is collected in changed.
func (gd *Guard) keepChanges(changed []byte, s string, done int, mid []byte) ([]byte, int) {
	if changed == nil {
		if done+len(mid) <= len(s) && s[done:done+len(mid)] == string(mid) {
			return nil, done + len(mid)
		}
		if !gd.afford(2 * len(s)) {
			return append([]byte{}, s[:done]...), done // over budget: the scan stops here
		}
		changed = append(make([]byte, 0, len(s)), s[:done]...)
	}
	return append(changed, mid...), done
}

// afford accounts n bytes a scan of a whole reply is about to allocate (large values only: small
// ones are covered by the reply's reservation). False: the reply is over
// upstream.max_buffered_bytes, to be refused (gd.overBudget), which is not a leak.
func (gd *Guard) afford(n int) bool {
	if gd.spend == nil || n < 64<<10 {
		return true
	}
	if !gd.spend(int64(n)) {
		gd.overBudget = true
		return false
	}
	return true
}

// detectIn looks for a foreign marker in a reply part that will be refused anyway (not JSON,
// or JSON with duplicate keys): its raw text, and every string of what did decode, shadowed
// duplicates included. False means a leak, to be recorded.
func (gd *Guard) detectIn(raw string, decoded any, shadowed []any) bool {
	if _, ok := gd.scanString(raw); !ok {
		return false
	}
	for _, v := range append(shadowed, decoded) {
		if !gd.detectAny(v) {
			return false
		}
	}
	return true
}

func (gd *Guard) detectAny(v any) bool {
	switch t := v.(type) {
	case string:
		_, ok := gd.scanString(t)
		return ok
	case map[string]any:
		for k, e := range t {
			if !gd.detectAny(k) || !gd.detectAny(e) {
				return false
			}
		}
	case []any:
		if s, ok := byteArray(t); ok && len(t) > 0 {
			return gd.detectAny(s)
		}
		for _, e := range t {
			if !gd.detectAny(e) {
				return false
			}
		}
	}
	return true
}

// inert is canary.Inert: text that needs no scanner.
func inert(s string) bool { return canary.Inert(s) }

// mainText says whether a field carries the reply's text in pieces: what its stateful scanner
// emits is what the client gets (held text is released later). Other strings are detected
// statefully but cleaned one value at a time, so ids and names keep their shape.
func mainText(name string) bool {
	switch name {
	case "content", "reasoning_content", "text", "arguments", "refusal", "partial_json", "thinking", "delta":
		return true
	}
	return false
}

// replyIDFields are token-id arrays in replies. A client holding the tokenizer can decode them
// into text the scanner never saw, and the gateway does not have the engine's vocabulary: with
// canaries on they are withheld (the text they encode is in the reply anyway).
var replyIDFields = map[string]bool{"output_ids": true}

func lastSeg(path string) string { return path[strings.LastIndexByte(path, '.')+1:] }

// walk scans every string, map key and byte array in v and returns the cleaned value. seq marks
// a sequence (anything under a logprobs object) whose items keep their own text: they are
// detected statefully but each cleaned on its own.
func (gd *Guard) walk(v any, path string, seq bool, changed *bool) (any, bool) {
	switch t := v.(type) {
	case string:
		out, ok := gd.scanField(t, path, seq)
		if !ok {
			return nil, false
		}
		*changed = *changed || out != t
		return out, true
	case map[string]any:
		for k, e := range t {
			if replyIDFields[k] {
				delete(t, k)
				*changed = true
				continue
			}
			if indexKeys[k] && !canonicalIndex(e) {
				gd.malformed = true
				return nil, false
			}
			if tupleIDFields(k) && withholdTupleIDs(e) {
				*changed = true
			}
			if seq {
				// Keys in a sequence are text a client may join (top_logprobs maps by token).
				if _, ok := gd.feed(path+".#key", k, false); !ok {
					return nil, false
				}
			}
			if strings.Contains(k, "KVG") || !isPlainKey(k) {
				clean, ok := gd.scanString(k)
				if !ok {
					return nil, false
				}
				if clean != k {
					delete(t, k)
					k, *changed = clean, true
				}
			}
			child := k // a whole body's strings need no path, only their key
			if seq || !gd.whole {
				child = path + "." + k
			}
			r, ok := gd.walk(e, child, seq || strings.Contains(k, "logprobs"), changed)
			if !ok {
				return nil, false
			}
			t[k] = r
		}
	case []any:
		if lastSeg(path) == "bytes" {
			if s, ok := byteArray(t); ok {
				// A token's UTF-8 bytes (OpenAI logprobs): the client can decode them.
				out, ok := gd.scanField(s, path, true)
				if !ok {
					return nil, false
				}
				if out != s {
					*changed = true
					return numbers([]byte(out)), true
				}
				return v, true
			}
		}
		for i, e := range t {
			child := path
			if seq || !gd.whole {
				seg := "*"
				if m, ok := e.(map[string]any); ok {
					if idx, ok := m["index"].(json.Number); ok {
						seg = "i" + idx.String()
					}
				}
				child = path + "." + seg
			}
			r, ok := gd.walk(e, child, seq, changed)
			if !ok {
				return nil, false
			}
			t[i] = r
		}
	}
	return v, true
}

// scanField scans one string value at path.
func (gd *Guard) scanField(s, path string, seq bool) (string, bool) {
	join := mainText(lastSeg(path))
	switch {
	case !gd.whole && !seq && join:
		return gd.feed(path, s, true)
	case seq || !gd.whole:
		// Detected across events or items; cleaned on its own below.
		if _, ok := gd.feed(path, s, false); !ok {
			return "", false
		}
	}
	return gd.scanValue(s, join)
}

// The joined detector (Guard.joined) reads every text value of the reply (the mainText fields) in
// the order it is emitted: clients join values (Anthropic's text blocks, the Responses API's
// output_text parts and items, choices, content then reasoning), so a marker split across any
// two of them must be seen whole. Ids, types and names stay out: they would break a split
// marker apart.

// joined feeds s (a value as its field's scanners emit it) to the joined detector and returns
// it with what the joined reading withholds: a run of HoldMin characters of a foreign marker
// across two values (say the last 5 of one text block and the first 5 of the next) is cut in
// the later value, since the earlier one was already emitted. A long value is read a piece at a
// time through buffers of one piece, charged once.
//
// Before that, the joined prefix scanner: where the end of what was emitted and the start of s
// join into "KVG-", s loses its part of it, and the run after it is judged (the requester's own
// marker stripped, as in one value). The prompt-text detector (Scope.Text) reads the values as
// they stand.
func (gd *Guard) joined(s string) (string, bool) {
	out, ok := gd.joinedView(unsafe.Slice(unsafe.StringData(s), len(s)))
	if !ok {
		return "", false
	}
	if len(out) == len(s) && (len(s) == 0 || unsafe.SliceData(out) == unsafe.StringData(s)) {
		return s, true
	}
	return string(out), true
}

// joinedView is joined on bytes it only reads: it returns b itself when the joined reading
// withheld nothing (no copy), else the reading's output. b must not be the guard's joinBuf.
func (gd *Guard) joinedView(b []byte) ([]byte, bool) { return gd.joinedRead(b, false) }

// joinedRead is joinedView; aliased: the prompt-text detector read b already (aliasText).
func (gd *Guard) joinedRead(b []byte, aliased bool) ([]byte, bool) {
	s := unsafe.String(unsafe.SliceData(b), len(b)) // read only, never kept
	if gd.kit == nil {
		gd.takeKit()
	}
	if js := gd.joinStrict; js.Idle() && !strings.Contains(s, canary.MarkerPrefix) {
		js.Pass(s) // the usual case: nothing to join, no copy
	} else {
		if !gd.afford(2 * len(s)) {
			return nil, false
		}
		gd.joinIn = append(gd.joinIn[:0], s...)
		// Its own output (rare: a "KVG-" or a pending prefix): b may be a view of gd.buf.
		out, v := js.FeedAll(nil, gd.joinIn)
		gd.note(v)
		if v.Leak != nil {
			return nil, false
		}
		if string(out) != s {
			b = out
			s = unsafe.String(unsafe.SliceData(b), len(b))
		}
	}
	if !gd.textOff && !aliased {
		if gd.joinText == nil {
			if gd.aliasText != nil {
				gd.joinText, gd.aliasText = gd.aliasText.Fork(), nil
			} else {
				gd.joinText = gd.reading()
			}
		}
	}
	if gd.joinText != nil && !aliased {
		if h := gd.joinText.Feed(s); h != nil {
			gd.noteLeak(h)
			return nil, false
		}
	}
	if !gd.joinCharged && len(s) >= 64<<10 {
		if !gd.afford(3 * scanPiece) {
			return nil, false
		}
		gd.joinCharged = true
	}
	var changed []byte
	done := 0
	for i := 0; i < len(s); {
		j := min(len(s), i+scanPiece)
		for j < len(s) && j > i+1 && !utf8.RuneStart(s[j]) {
			j--
		}
		gd.joinIn = append(gd.joinIn[:0], s[i:j]...)
		// FeedAll: the value's last escape is read as it stands; the run carries on.
		mid, h := gd.joinLoose.FeedAll(gd.joinBuf[:0], gd.joinIn)
		gd.joinBuf = mid[:0]
		if h != nil {
			gd.noteLeak(h)
			return nil, false
		}
		changed, done = gd.keepChanges(changed, s, done, mid)
		i = j
	}
	if gd.overBudget {
		return nil, false
	}
	if changed != nil {
		return changed, true
	}
	return b, true
}

// indexKeys are the fields by which clients merge pieces of a reply (choices, tool calls,
// content blocks, output items and parts).
var indexKeys = map[string]bool{"index": true, "output_index": true, "content_index": true}

// canonicalIndex: a JSON integer written canonically, 0 to 999,999,999. JavaScript reads 0.0, -0,
// 0e0 and "0" as the same index 0, so a reply that spells one index two ways could have its
// pieces joined by the client and never by the scanner: anything but the canonical form is
// refused.
func canonicalIndex(v any) bool {
	n, ok := v.(json.Number)
	if !ok || len(n) == 0 || len(n) > 9 || len(n) > 1 && n[0] == '0' {
		return false
	}
	for i := 0; i < len(n); i++ {
		if n[i] < '0' || n[i] > '9' {
			return false
		}
	}
	return true
}

// tupleIDFields: SGLang's native logprobs (meta_info.output_token_logprobs, input_top_logprobs,
// output_token_ids_logprobs, ...) are tuples [logprob, token id, text or null]. A client with
// the vocabulary decodes the ids into text the scanner never saw, and the gateway does not have
// it: with canaries on, the ids are withheld (null); the logprob and any text stay.
func tupleIDFields(k string) bool {
	return strings.HasSuffix(k, "_logprobs") && (strings.HasPrefix(k, "output_") || strings.HasPrefix(k, "input_"))
}

// withholdTupleIDs nulls the id of every [logprob, id] or [logprob, id, text] tuple in v (at
// any depth: top-k lists nest them); true if it changed anything.
func withholdTupleIDs(v any) bool {
	a, ok := v.([]any)
	if !ok {
		return false
	}
	if len(a) == 2 || len(a) == 3 {
		_, lp := a[0].(json.Number)
		_, id := a[1].(json.Number)
		if (lp || a[0] == nil) && id { // the first input token's logprob is null
			a[1] = nil
			return true
		}
	}
	changed := false
	for _, e := range a {
		changed = withholdTupleIDs(e) || changed
	}
	return changed
}

// Malformed says the reply was refused for breaking a rule clients rely on, not for a leak.
func (gd *Guard) Malformed() bool { return gd.malformed }

// isPlainKey: a key that cannot carry or disguise a marker (every key of the APIs themselves);
// anything else is scanned.
func isPlainKey(k string) bool { return canary.Inert(k) }

// byteArray reads an array of integers 0..255 as bytes.
func byteArray(a []any) (string, bool) {
	b := make([]byte, len(a))
	for i, e := range a {
		n, ok := e.(json.Number)
		if !ok {
			return "", false
		}
		v, err := strconv.Atoi(n.String())
		if err != nil || v < 0 || v > 255 {
			return "", false
		}
		b[i] = byte(v)
	}
	return string(b), true
}

func numbers(b []byte) []any {
	out := make([]any, len(b))
	for i, c := range b {
		out[i] = json.Number(strconv.Itoa(int(c)))
	}
	return out
}

var errTrailing = errors.New("data after the JSON value")

// decodeOne decodes exactly one JSON value (decodeStrict's value; a duplicate key is an error).
func decodeOne(b []byte) (any, error) {
	v, _, err := DecodeStrict(b)
	return v, err
}

// body scans a whole decoded reply in place; false means a foreign marker was found. changed:
// the scan changed the value (the engine's bytes cannot be passed on).
func (gd *Guard) body(v any) (out any, changed, ok bool) {
	gd.whole = true
	v, ok = gd.walk(v, "", false, &changed)
	if !ok || gd.flushHeld() {
		return nil, false, false
	}
	return v, changed, true
}

// flushHeld settles every scanner at the end of a whole body; true means a leak.
func (gd *Guard) flushHeld() bool {
	for _, key := range gd.order {
		gd.settle(gd.fields[key], joinedField(key))
	}
	return gd.leak != nil
}

// settle flushes one field's scanners: what the prefix scanner held goes through the joined
// reading (join) and the folded detector, which then settles a partial escape. It returns what
// the client may still get.
func (gd *Guard) settle(f *fieldScan, join bool) []byte {
	rest, v := f.strict.FlushVerdict(nil)
	gd.note(v)
	if gd.leak != nil {
		return nil
	}
	if join && len(rest) > 0 {
		j, ok := gd.joined(string(rest))
		if !ok {
			return nil
		}
		rest = []byte(j)
	}
	out, h := f.loose.Feed(nil, rest)
	if h == nil {
		out, h = f.loose.Flush(out)
	}
	if h != nil {
		gd.noteLeak(h)
		return nil
	}
	return out
}

// event scans one decoded SSE event's data. It returns the value to send and false when the
// reply must be cut.
func (gd *Guard) event(v any) (any, bool) {
	obj, isObj := v.(map[string]any)
	changed := false
	if !isObj {
		return gd.walk(v, "", false, &changed)
	}
	if idx, ok := obj["index"].(json.Number); ok && gd.sc.Kind == request.Messages {
		gd.lastBlock = idx // where held text of a content block goes back
	}
	if !gd.textOff {
		gd.setItem(numberBytes(obj["index"]), numberBytes(obj["output_index"]), numberBytes(obj["content_index"]))
	}
	var restore func()
	if gd.sc.Kind == request.Generate {
		if t, ok := obj["text"].(string); ok {
			key := "0"
			if idx, ok := obj["index"].(json.Number); ok {
				key = idx.String()
			}
			suffix := t
			if raw := gd.rawCum[key]; strings.HasPrefix(t, raw) {
				suffix = t[len(raw):] // SGLang's stream repeats the whole text so far
			}
			out, ok := gd.feed("gen:"+key, suffix, true)
			if !ok {
				return nil, false
			}
			if gd.rawCum == nil {
				gd.rawCum, gd.outCum = map[string]string{}, map[string]string{}
			}
			gd.rawCum[key] = t
			gd.outCum[key] += out
			delete(obj, "text") // scanned above as a stream; put back below
			restore = func() { obj["text"] = gd.outCum[key] }
		}
	}
	if _, ok := gd.walk(obj, "", false, &changed); !ok {
		return nil, false
	}
	if restore != nil {
		restore()
	}
	return obj, true
}

// numberBytes is a JSON number's text (nil for anything else).
func numberBytes(v any) []byte {
	if n, ok := v.(json.Number); ok {
		return []byte(n)
	}
	return nil
}

// heldEvent is text the scanners held, released as an event of the reply's own shape.
type heldEvent struct {
	name string // SSE event name, "" for none
	data []byte
}

// flush releases text the scanners held back at the end of the stream, as events of the reply's
// own shape for its main text fields; what other fields held (at most a few characters) is
// dropped. Any leak settled here is recorded in gd.leak.
func (gd *Guard) flush() []heldEvent {
	var out []heldEvent
	for _, key := range gd.order {
		rest := gd.settle(gd.fields[key], joinedField(key))
		if len(rest) == 0 || gd.leak != nil {
			continue
		}
		if idx, ok := strings.CutPrefix(key, "gen:"); ok {
			if gd.outCum == nil {
				gd.outCum = map[string]string{}
			}
			gd.outCum[idx] += string(rest)
			out = append(out, heldEvent{data: CanonicalJSON(map[string]any{"text": gd.outCum[idx], "meta_info": map[string]any{"id": gd.sc.EngineRID}})})
			continue
		}
		switch key {
		case ".delta": // Responses API: response.output_text.delta
			out = append(out, heldEvent{name: "response.output_text.delta",
				data: CanonicalJSON(map[string]any{"type": "response.output_text.delta", "delta": string(rest)})})
			continue
		case ".delta.text": // Anthropic: content_block_delta
			out = append(out, heldEvent{name: "content_block_delta", data: CanonicalJSON(map[string]any{"type": "content_block_delta",
				"index": gd.lastBlock, "delta": map[string]any{"type": "text_delta", "text": string(rest)}})})
			continue
		}
		// ".choices.i<N>.delta.<field>" (chat) or ".choices.i<N>.text" (completions)
		parts := strings.Split(key, ".")
		if len(parts) < 4 || parts[1] != "choices" || !strings.HasPrefix(parts[2], "i") {
			continue
		}
		n, err := strconv.Atoi(parts[2][1:])
		if err != nil {
			continue
		}
		switch {
		case len(parts) == 5 && parts[3] == "delta" && (parts[4] == "content" || parts[4] == "reasoning_content"):
			out = append(out, heldEvent{data: CanonicalJSON(map[string]any{"object": "chat.completion.chunk", "choices": []any{
				map[string]any{"index": n, "delta": map[string]any{parts[4]: string(rest)}, "finish_reason": nil}}})})
		case len(parts) == 4 && parts[3] == "text":
			out = append(out, heldEvent{data: CanonicalJSON(map[string]any{"object": "text_completion", "choices": []any{
				map[string]any{"index": n, "text": string(rest), "finish_reason": nil}}})})
		}
	}
	return out
}
