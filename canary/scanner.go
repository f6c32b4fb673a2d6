package canary

import (
	"bytes"
	"unicode/utf8"
)

// Redacted replaces any "KVG-" text that is neither the requester's marker, an echo, nor a leak.
// It starts with '[' so that it can never complete a "KVG-" with the bytes before it.
const Redacted = "[redacted]"

// holdMax bounds the run of "K"/"KV"/"KVG" pieces held at the end of an event (see chainSuffix).
const holdMax = 64

// contextSide is how many bytes of text each side of a hit go into Hit.Context.
const contextSide = 100

var prefixBytes = []byte(MarkerPrefix)

// Verdict is what one Feed found.
type Verdict struct {
	Leak   *Hit  // nil unless a foreign marker (or ≥ 8-character fragment of one) was found
	Echoes []Hit // echoes seen in this event; nil (no allocation) when there are none
}

// Hit describes one marker found in reply text.
type Hit struct {
	Marker  string // the matched text, "KVG-" included (possibly a fragment): never send it to a client
	Victim  string // owner tenant
	Epoch   uint64
	Context string // up to 200 bytes around the hit, markers and "KVG-" text redacted
}

// Scanner checks the decoded text of one reply stream (one per choice index). It is not safe for
// concurrent use. Feed emits text without "KVG-" byte-identical and at once; only a tail that
// could begin a marker ("K", "KV", "KVG", "KVG-", "KVG-abc…") is held back until the next Feed or
// Flush settles it.
//
// Semantics, applied to the leftmost "KVG-" at each step; run = the base32 characters after it,
// at most 20:
//   - fewer than 8 characters: "KVG-" redacted (replaced by Redacted; the run stays, for the
//     folded detector that reads the output);
//   - the first 8 characters begin no live marker: "KVG-" redacted, likewise;
//   - they begin the requester's own marker (any live epoch): stripped, run included;
//   - they begin a foreign marker found in the requester's prompt (echo set): stripped, reported
//     as an echo;
//   - they begin another tenant's marker: a leak; nothing from "KVG-" on is emitted, and the
//     scanner emits nothing more.
//
// If 8-character prefixes of live markers of different classes collide (about once among 10^6
// live markers), the scanner waits for the whole run and picks the candidate sharing the most
// characters (ties: leak before echo before own). Stripping can join the bytes before and after
// the marker ("KV" + marker + "G-…"); the joined text is scanned again, so that never emits "KVG-".
type Scanner struct {
	k       *Keyring
	tenant  string
	echoes  []string
	held    [holdMax + MarkerLen]byte // undecided tail
	nheld   int
	swallow int    // run characters still to drop at the start of the next text
	buf     []byte // work buffer: held ++ text, reused across Feeds
	hist    [contextSide]byte
	nhist   int // bytes of hist in use: the last bytes emitted, for Hit.Context
	cut     *Hit
	// carry (FeedAll): the end of what was emitted so far that begins "KVG-" ("K", "KV", "KVG").
	carry  [3]byte
	ncarry int
}

// NewScanner returns a scanner for replies to tenant. echoes are the foreign markers found in
// tenant's own prompt (FindMarkers); the slice is retained, not copied.
func (k *Keyring) NewScanner(tenant string, echoes []string) *Scanner {
	s := &Scanner{k: k}
	s.Reset(tenant, echoes)
	return s
}

// Reset prepares s for a new stream, keeping its buffers (sync.Pool friendly).
func (s *Scanner) Reset(tenant string, echoes []string) {
	s.tenant = tenant
	s.echoes = echoes
	s.nheld = 0
	s.swallow = 0
	s.nhist = 0
	s.cut = nil
	s.buf = s.buf[:0]
	s.ncarry = 0
}

// FeedAll is Feed for a value that is emitted whole, which a client joins to the values before
// it (the joined reading of a reply's text values): nothing is held for the next value. A "K",
// "KV" or "KVG" that ended what was emitted before is completed into "KVG-" by the start of
// text as the client joins them: that part of text never goes out, and the run after it is
// judged as after any "KVG-" (the requester's own marker stripped, a foreign one a leak, anything
// else redacted). A run cut by the end of text continues into the next value (stripped there too).
func (s *Scanner) FeedAll(dst, text []byte) ([]byte, Verdict) {
	if s.cut != nil {
		return dst, Verdict{Leak: s.cut}
	}
	start := len(dst)
	var v Verdict
	if s.swallow > 0 {
		n := b32run(text, s.swallow)
		if n < len(text) {
			s.swallow = 0
		} else {
			s.swallow -= n
		}
		text = text[n:]
	}
	for s.ncarry > 0 && bytes.HasPrefix(text, prefixBytes[s.ncarry:]) {
		rest := text[len(MarkerPrefix)-s.ncarry:]
		r := b32run(rest, MarkerChars)
		cl, owner, epoch := s.classify(rest[:r], true)
		switch cl {
		case classLeak:
			h := s.hit(dst[start:], append(append([]byte{}, MarkerPrefix...), rest[:r]...), rest[r:], owner, epoch)
			s.cut = &h
			v.Leak = s.cut
			return dst, v
		case classOwn, classEcho:
			if cl == classEcho {
				v.Echoes = append(v.Echoes, s.hit(dst[start:], append(append([]byte{}, MarkerPrefix...), rest[:r]...), rest[r:], owner, epoch))
			}
			if r == len(rest) && r < MarkerChars {
				s.swallow = MarkerChars - r // the run goes on in the next value
			}
			text = rest[r:] // the emitted chain stays: what follows is checked against it again
		default:
			// Only the reserved prefix goes (its part in text); the run stays for the folded
			// detector. Redacted begins with '[': the chain before it can no longer join "KVG-".
			dst = append(dst, Redacted...)
			text = rest
			s.ncarry = 0
		}
	}
	dst = s.scan(dst, start, text, false, true, &v)
	if v.Leak == nil {
		s.remember(dst[start:])
		keepCarry(s, dst[start:])
	}
	return dst, v
}

// Idle says FeedAll has nothing pending from earlier values: no chain that text could complete
// into "KVG-", no run to drop the rest of. Then a text without "KVG-" passes FeedAll unchanged,
// and Pass is enough.
func (s *Scanner) Idle() bool { return s.ncarry == 0 && s.swallow == 0 && s.cut == nil }

// Pass records text as emitted unchanged (FeedAll's result when Idle and text holds no "KVG-"),
// reading only its end.
func (s *Scanner) Pass(text string) {
	if len(text) >= contextSide {
		s.nhist = copy(s.hist[:], text[len(text)-contextSide:])
	} else {
		keep := min(contextSide-len(text), s.nhist)
		copy(s.hist[:], s.hist[s.nhist-keep:s.nhist])
		s.nhist = keep + copy(s.hist[keep:], text)
	}
	keepCarry(s, text)
}

// keepCarry updates s's carry with out, just emitted.
func keepCarry[T string | []byte](s *Scanner, out T) {
	var tail [3]byte
	n := 0
	for i := len(out) - 1; i >= 0 && n < 3; i-- {
		n++
		tail[3-n] = out[i]
	}
	for i := s.ncarry - 1; i >= 0 && n < 3; i-- {
		n++
		tail[3-n] = s.carry[i]
	}
	s.ncarry = partialSuffix(tail[3-n:])
	copy(s.carry[:], tail[3-s.ncarry:])
}

// Feed takes the new decoded text of one event and appends to dst the text that may be emitted
// now. On a leak, dst gets only the text before the marker and Verdict.Leak is set: the caller
// must cut the stream there; later Feeds emit nothing and report the same leak. text is only
// read; dst must not overlap it.
func (s *Scanner) Feed(dst, text []byte) ([]byte, Verdict) {
	if s.cut != nil {
		return dst, Verdict{Leak: s.cut}
	}
	start := len(dst)
	if s.swallow > 0 {
		n := b32run(text, s.swallow)
		if n < len(text) {
			s.swallow = 0 // the run ended inside this text
		} else {
			s.swallow -= n
		}
		text = text[n:]
	}
	b := text
	owned := false
	if s.nheld > 0 {
		s.buf = append(append(s.buf[:0], s.held[:s.nheld]...), text...)
		b, owned = s.buf, true
		s.nheld = 0
	}
	var v Verdict
	dst = s.scan(dst, start, b, owned, false, &v)
	s.remember(dst[start:])
	return dst, v
}

// Flush settles the held tail at the end of the stream (redact or strip) and appends what may be
// emitted. A leak or echo settled here is dropped from the report; use FlushVerdict to see it.
func (s *Scanner) Flush(dst []byte) []byte {
	dst, _ = s.FlushVerdict(dst)
	return dst
}

// FlushVerdict is Flush that also reports what the held tail turned out to be. A leak can only be
// settled here when 8-character prefixes of live markers collide; its bytes are not emitted.
func (s *Scanner) FlushVerdict(dst []byte) ([]byte, Verdict) {
	s.swallow = 0
	if s.cut != nil || s.nheld == 0 {
		return dst, Verdict{}
	}
	s.buf = append(s.buf[:0], s.held[:s.nheld]...)
	s.nheld = 0
	var v Verdict
	start := len(dst)
	dst = s.scan(dst, start, s.buf, true, true, &v)
	s.remember(dst[start:])
	return dst, v
}

// ScanAll is the non-streaming convenience: it scans a whole text and returns the cleaned text
// and the verdict (on a leak, the text before the marker).
func (k *Keyring) ScanAll(tenant string, echoes []string, text []byte) ([]byte, Verdict) {
	s := k.NewScanner(tenant, echoes)
	out, v := s.Feed(make([]byte, 0, len(text)), text)
	if v.Leak != nil {
		return out, v
	}
	out, fv := s.FlushVerdict(out)
	v.Leak = fv.Leak
	v.Echoes = append(v.Echoes, fv.Echoes...)
	return out, v
}

type class uint8

const (
	classWait class = iota
	classRedact
	classOwn
	classEcho
	classLeak
)

// scan processes b (held ++ new text, or just the new text when owned is false, in which case b
// belongs to the caller and is never written). emitStart is where this call's output began in dst.
func (s *Scanner) scan(dst []byte, emitStart int, b []byte, owned, final bool, v *Verdict) []byte {
	i := 0
	for {
		j := bytes.Index(b[i:], prefixBytes)
		if j < 0 {
			break
		}
		p := i + j
		runStart := p + len(MarkerPrefix)
		r := b32run(b[runStart:], MarkerChars)
		end := runStart + r
		terminated := final || r == MarkerChars || end < len(b)
		cl, owner, epoch := s.classify(b[runStart:end], terminated)
		switch cl {
		case classWait:
			c := chainSuffix(b[i:p], holdMax)
			dst = append(dst, b[i:p-c]...)
			s.nheld = copy(s.held[:], b[p-c:])
			return dst
		case classLeak:
			dst = append(dst, b[i:p]...)
			h := s.hit(dst[emitStart:], b[p:end], b[end:], owner, epoch)
			s.cut = &h
			v.Leak = s.cut
			return dst
		case classRedact:
			// Only the reserved prefix goes: the characters after it are the folded detector's
			// to judge (a stretch of a marker behind a stray "KVG-" is still evidence).
			dst = append(dst, b[i:p]...)
			dst = append(dst, Redacted...)
			i = runStart
		case classOwn, classEcho:
			if cl == classEcho {
				dst = append(dst, b[i:p]...)
				v.Echoes = append(v.Echoes, s.hit(dst[emitStart:], b[p:end], b[end:], owner, epoch))
				dst = dst[:len(dst)-(p-i)]
			}
			// Bytes just before the marker that could begin "KVG-" are rescanned with what follows
			// (at most holdMax of them, so rescans stay linear).
			t := chainSuffix(b[i:p], holdMax)
			dst = append(dst, b[i:p-t]...)
			if s.emittedPartial(dst[emitStart:]) {
				// Pathological: a chain longer than holdMax was partly emitted already and
				// stripping would join it with what follows; a separator keeps "KVG-" out.
				dst = append(dst, b[p-t:p]...)
				dst = append(dst, Redacted...)
				i = end
				break
			}
			i = end
			if t > 0 {
				if owned {
					copy(b[end-t:end], b[p-t:p])
				} else {
					s.buf = append(append(s.buf[:0], b[p-t:p]...), b[end:]...)
					b, owned = s.buf, true
					end = t
				}
				i = end - t
			}
		}
		if !final && r < MarkerChars && end == len(b) && cl != classWait && cl != classRedact {
			// The run reached the end of this text: drop its continuation from the next one.
			s.swallow = MarkerChars - r
		}
	}
	rest := b[i:]
	if final {
		return append(dst, rest...)
	}
	t := chainSuffix(rest, holdMax)
	dst = append(dst, rest[:len(rest)-t]...)
	s.nheld = copy(s.held[:], rest[len(rest)-t:])
	return dst
}

// chainSuffix returns the length (at most max) of the longest suffix of b made of the pieces
// "K", "KV" and "KVG". One piece could begin "KVG-" with the next event; several could too once
// markers between them are stripped ("KV" + "K" + own + "VG-" + own + "G-"), so the whole chain
// is held. The parse from the end is unique: the last byte says which piece ends there.
func chainSuffix(b []byte, max int) int {
	n := 0
	for {
		t := partialSuffix(b[:len(b)-n])
		if t == 0 || n+t > max {
			return n
		}
		n += t
	}
}

// emittedPartial reports whether the output so far (earlier Feeds, then out) ends in "K", "KV"
// or "KVG".
func (s *Scanner) emittedPartial(out []byte) bool {
	var tail [3]byte
	n := 0
	for i := len(out) - 1; i >= 0 && n < 3; i-- {
		n++
		tail[3-n] = out[i]
	}
	for i := s.nhist - 1; i >= 0 && n < 3; i-- {
		n++
		tail[3-n] = s.hist[i]
	}
	return partialSuffix(tail[3-n:]) > 0
}

// partialSuffix returns the length of the suffix of b that is a proper prefix of "KVG-" (0..3).
func partialSuffix(b []byte) int {
	n := len(b)
	switch {
	case n >= 3 && b[n-3] == 'K' && b[n-2] == 'V' && b[n-1] == 'G':
		return 3
	case n >= 2 && b[n-2] == 'K' && b[n-1] == 'V':
		return 2
	case n >= 1 && b[n-1] == 'K':
		return 1
	}
	return 0
}

// classify decides what the run of base32 characters after a "KVG-" is. terminated says whether
// the run can still grow (more text may follow).
func (s *Scanner) classify(run []byte, terminated bool) (class, string, uint64) {
	if len(run) < FragmentMin {
		if terminated {
			return classRedact, "", 0
		}
		return classWait, "", 0
	}
	r := s.k.ring()
	// One pass over the live markers that begin with run's first 8 characters: the class of the
	// first, whether classes differ, the candidate agreeing longest (first wins a tie), and the
	// one agreeing longest with leak before echo before own on a tie.
	var (
		n         int
		fc        class
		mixed     bool
		best      *markerRec
		bestLen   int
		pick      *markerRec
		pickLen   int
		pickClass class
	)
	r.prefixed(run, func(m *markerRec) {
		c, l := s.classOf(r, run, m), commonLen(run, m)
		if n == 0 {
			fc = c
		} else if c != fc {
			mixed = true
		}
		n++
		if best == nil || l > bestLen {
			best, bestLen = m, l
		}
		if pick == nil || l > pickLen || (l == pickLen && c > pickClass) {
			pick, pickLen, pickClass = m, l, c
		}
	})
	if n == 0 {
		return classRedact, "", 0
	}
	if fc == classEcho && !mixed && !terminated {
		// An echo reaches only as far as the requester sent it: wait for the whole run, so a
		// character beyond the echo is seen before the run is stripped.
		return classWait, "", 0
	}
	if !mixed {
		return fc, r.tenants[best.tenant].name, best.epoch
	}
	if !terminated {
		return classWait, "", 0
	}
	return pickClass, r.tenants[pick.tenant].name, pick.epoch
}

// classOf says what a candidate marker (whose first 8 characters equal run's) means for this
// scanner's tenant. Own first: the requester's own marker can be in its echo set too.
func (s *Scanner) classOf(r *ring, run []byte, m *markerRec) class {
	if r.tenants[m.tenant].name == s.tenant {
		return classOwn
	}
	if len(s.echoes) > 0 {
		// An echo only as far as the requester sent the marker itself: "KVG-" and run must lie
		// within what a descriptor holds (FindMarkerFragments).
		span := uint32(1)<<uint(len(run)) - 1
		if echoedMask(s.echoes, &m.body)&span == span {
			return classEcho
		}
	}
	return classLeak
}

// commonLen is how many characters of run agree with the candidate m.
func commonLen(run []byte, m *markerRec) int {
	n := FragmentMin
	for n < len(run) && run[n] == m.body[n] {
		n++
	}
	return n
}

// hit builds a Hit; before is what this call emitted so far, after the raw text after the run.
func (s *Scanner) hit(before, match, after []byte, victim string, epoch uint64) Hit {
	// Emitted text never contains "KVG-"; the history plus this call's output is the left side.
	left := make([]byte, 0, s.nhist+len(before))
	left = append(append(left, s.hist[:s.nhist]...), before...)
	if len(left) > contextSide {
		left = left[len(left)-contextSide:]
	}
	for len(left) > 0 && !utf8.RuneStart(left[0]) {
		left = left[1:]
	}
	ctx := make([]byte, 0, len(left)+len(after)+16)
	ctx = append(ctx, left...)
	ctx = append(ctx, "[marker]"...)
	if len(after) > contextSide {
		cut := contextSide
		for cut > 0 && !utf8.RuneStart(after[cut]) {
			cut-- // never split a UTF-8 sequence
		}
		after = after[:cut]
	}
	ctx = append(ctx, RedactAll(after)...)
	return Hit{Marker: string(match), Victim: victim, Epoch: epoch, Context: string(ctx)}
}

// remember keeps the last contextSide bytes emitted, for the left side of Hit.Context.
func (s *Scanner) remember(out []byte) {
	if len(out) >= contextSide {
		s.nhist = copy(s.hist[:], out[len(out)-contextSide:])
		return
	}
	keep := contextSide - len(out)
	if keep > s.nhist {
		keep = s.nhist
	}
	copy(s.hist[:], s.hist[s.nhist-keep:s.nhist])
	s.nhist = keep + copy(s.hist[keep:], out)
}

// RedactAll returns b with every "KVG-" and the base32 run after it (up to 20 characters)
// replaced by Redacted, whoever the marker belongs to. It is for logs and incident records.
func RedactAll(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for {
		j := bytes.Index(b, prefixBytes)
		if j < 0 {
			return append(out, b...)
		}
		out = append(out, b[:j]...)
		out = append(out, Redacted...)
		b = b[j+len(MarkerPrefix):]
		b = b[b32run(b, MarkerChars):]
	}
}
