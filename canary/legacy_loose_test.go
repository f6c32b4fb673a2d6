package canary

// The folded detector as it was on main before issue 17's rework (12-character windows in a Go
// map, no separators, reversal, references or look-alikes), kept only so that
// BenchmarkScannerSideBySide measures today's scanner against it in one run.

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

func legacyWindowKey(w []byte) uint64 {
	var k uint64
	for _, c := range w[:LooseMin] {
		k = k<<5 | uint64(b32val[c])
	}
	return k
}

// newLegacyLoose builds main's window maps from k's markers.
func newLegacyLoose(k *Keyring, tenant string) *legacyLoose {
	l := &legacyLoose{k: k, tenant: tenant, windows: map[uint64]uint64{}, winOverflow: map[uint64][]uint64{}}
	r0 := k.ring()
	l.tenants = r0.tenants
	l.byPrefix, l.overflow = map[uint64]legacyEntry{}, map[uint64][]legacyEntry{}
	for _, r := range r0.recs {
		// main's keyring held every live marker by its first 8 characters.
		var en legacyEntry
		copy(en.rest[:], r.body[FragmentMin:])
		en.tenant, en.epoch = r.tenant, r.epoch
		if _, taken := l.byPrefix[prefixKey(r.body[:])]; taken {
			l.overflow[prefixKey(r.body[:])] = append(l.overflow[prefixKey(r.body[:])], en)
		} else {
			l.byPrefix[prefixKey(r.body[:])] = en
		}
		pk := prefixKey(r.body[:])
		for off := 0; off+LooseMin <= MarkerChars; off++ {
			w := legacyWindowKey(r.body[off : off+LooseMin])
			if _, taken := l.windows[w]; taken {
				l.winOverflow[w] = append(l.winOverflow[w], pk)
			} else {
				l.windows[w] = pk
			}
		}
	}
	return l
}

// legacyHoldCap bounds the original bytes one undecided candidate may hold back (invisible
// characters can pad a candidate without adding folded characters).
const legacyHoldCap = 4096

// legacyLoose is the folded-text detector of one reply field. A run of LooseMin folded characters
// equal to consecutive characters of a live foreign marker's body, from any offset, is a hit (a
// leak: nothing from the window's first character not yet emitted on is emitted). It emits text
// at once, except a trailing run of at least FragmentMin folded characters that still agrees with
// the start of a live foreign marker: that is held until it grows into a hit or stops agreeing.
// So at most FragmentMin−1 characters from a foreign marker's start, folded, ever reach a client;
// a run from another offset is cut at its LooseMin-th character, and only the part of it that
// earlier Feeds already emitted (at most LooseMin−1 characters) reached the client. Own markers
// and the requester's echoes are not hits. It is not safe for concurrent use.
type legacyLoose struct {
	k      *Keyring
	tenant string
	echoes []string
	held   []byte // original bytes of an undecided candidate, not yet emitted
	buf    []byte
	// run: the folded characters of the current run that were already emitted, at most
	// LooseMin−1 (older ones can no longer begin a hit that reaches LooseMin).
	run  []byte
	cut  *Hit
	hist []byte // the last bytes emitted, for Hit.Context
	// the window maps and prefix maps main's Keyring held, behind its read lock
	windows     map[uint64]uint64
	winOverflow map[uint64][]uint64
	mu          sync.RWMutex
	tenants     []*tenantState
	byPrefix    map[uint64]legacyEntry
	overflow    map[uint64][]legacyEntry
}

// legacyEntry is main's keyring entry: a live marker stored by its first 8 characters.
type legacyEntry struct {
	rest   [MarkerChars - FragmentMin]byte
	tenant uint32
	epoch  uint64
}

// legacyEntryBody rebuilds the 20 characters of the marker stored as en under prefix key key.
func legacyEntryBody(key uint64, en *legacyEntry) (body [MarkerChars]byte) {
	for i := FragmentMin - 1; i >= 0; i-- {
		body[i] = b32alphabet[key&31]
		key >>= 5
	}
	copy(body[FragmentMin:], en.rest[:])
	return body
}

// Reset prepares l for a new field, keeping its buffers.
func (l *legacyLoose) Reset(tenant string, echoes []string) {
	l.tenant, l.echoes = tenant, echoes
	l.held, l.run, l.cut, l.hist = l.held[:0], l.run[:0], nil, l.hist[:0]
}

// legacyFoldASCII maps an ASCII byte to its lowercase base32 character, 0 for a byte that ends a run.
var legacyFoldASCII = func() (t [128]byte) {
	for c := 0; c < 128; c++ {
		l := byte(c)
		if l >= 'A' && l <= 'Z' {
			l += 'a' - 'A'
		}
		if b32val[l] >= 0 {
			t[c] = l
		}
	}
	return t
}()

// fold classifies the rune at b[i:]: a base32 character (folded), invisible (0, skip=true), or
// anything else (0, skip=false), and its size.
func legacyFold(b []byte) (c byte, skip bool, size int) {
	if b[0] < utf8.RuneSelf {
		return legacyFoldASCII[b[0]], false, 1
	}
	r, size := utf8.DecodeRune(b)
	switch {
	case r >= 0xFF21 && r <= 0xFF3A: // fullwidth A–Z
		return legacyFoldASCII['a'+byte(r-0xFF21)], false, size
	case r >= 0xFF41 && r <= 0xFF5A: // fullwidth a–z
		return legacyFoldASCII['a'+byte(r-0xFF41)], false, size
	case r >= 0xFF10 && r <= 0xFF19: // fullwidth digits
		return legacyFoldASCII['0'+byte(r-0xFF10)], false, size
	case r == utf8.RuneError && size == 1:
		return 0, false, size
	case unicode.In(r, unicode.Cf, unicode.Mn, unicode.Me) || r == 0x2800 || r == 0x3164 || r == 0x115F || r == 0x1160:
		// Format characters (zero-width space and joiners, BOM, soft hyphen, bidi marks),
		// combining and variation marks, blank fillers: a reader does not see them between
		// two letters.
		return 0, true, size
	}
	return 0, false, size
}

type legacyClass uint8

const (
	legacyNone legacyClass = iota // no live marker begins with these characters
	legacyMine                    // the requester's own marker or an echo of its prompt
	legacyForeign
)

// classify says whom the folded characters run (FragmentMin ≤ len ≤ MarkerChars) belong to.
func (l *legacyLoose) classify(run []byte) (legacyClass, string, uint64) {
	key := prefixKey(run)
	k := l
	k.mu.RLock()
	defer k.mu.RUnlock()
	first, ok := k.byPrefix[key]
	if !ok {
		return legacyNone, "", 0
	}
	best, victim, epoch := legacyNone, "", uint64(0)
	check := func(e *legacyEntry) {
		if string(e.rest[:len(run)-FragmentMin]) != string(run[FragmentMin:]) {
			return
		}
		name := k.tenants[e.tenant].name
		c := legacyForeign
		if name == l.tenant || l.isEcho(run) {
			c = legacyMine
		}
		if c > best {
			best, victim, epoch = c, name, e.epoch
		}
	}
	check(&first)
	for i := range k.overflow[key] {
		check(&k.overflow[key][i])
	}
	return best, victim, epoch
}

// classifyWindow says whom a run of LooseMin folded characters belongs to: a live marker whose
// body holds it at any offset. One map access by the window's 60 bits; candidates are verified
// against the marker's body (foreign wins a tie, as in classify).
func (l *legacyLoose) classifyWindow(win []byte) (legacyClass, string, uint64) {
	key := legacyWindowKey(win)
	k := l
	k.mu.RLock()
	defer k.mu.RUnlock()
	first, ok := l.windows[key]
	if !ok {
		return legacyNone, "", 0
	}
	best, victim, epoch := legacyNone, "", uint64(0)
	check := func(pk uint64, e *legacyEntry) {
		body := legacyEntryBody(pk, e)
		if !legacyHasWindow(body[:], win) {
			return
		}
		name := k.tenants[e.tenant].name
		c := legacyForeign
		if name == l.tenant || l.echoHolds(win) {
			c = legacyMine
		}
		if c > best {
			best, victim, epoch = c, name, e.epoch
		}
	}
	prefixes := func(pk uint64) {
		if e, ok := k.byPrefix[pk]; ok {
			check(pk, &e)
		}
		for i := range k.overflow[pk] {
			check(pk, &k.overflow[pk][i])
		}
	}
	prefixes(first)
	for _, pk := range l.winOverflow[key] {
		if pk != first {
			prefixes(pk)
		}
	}
	return best, victim, epoch
}

// legacyHasWindow says whether win occurs in body.
func legacyHasWindow(body, win []byte) bool {
	for off := 0; off+len(win) <= len(body); off++ {
		if string(body[off:off+len(win)]) == string(win) {
			return true
		}
	}
	return false
}

// echoHolds says whether win occurs anywhere in the body of one of the requester's echoes.
func (l *legacyLoose) echoHolds(win []byte) bool {
	for _, e := range l.echoes {
		if len(e) != MarkerLen {
			continue
		}
		for off := len(MarkerPrefix); off+len(win) <= len(e); off++ {
			if e[off:off+len(win)] == string(win) {
				return true
			}
		}
	}
	return false
}

func (l *legacyLoose) isEcho(run []byte) bool {
	for _, e := range l.echoes {
		if len(e) == MarkerLen && e[len(MarkerPrefix):len(MarkerPrefix)+len(run)] == string(run) {
			return true
		}
	}
	return false
}

// Feed takes the next text of the field and appends to dst what may be emitted now. On a leak it
// returns the hit; dst then has only the text before the run, and the reply must be cut.
func (l *legacyLoose) Feed(dst, text []byte) ([]byte, *Hit) {
	return l.feed(dst, text, false)
}

// Flush settles a held candidate at the end of the field (it never made a hit: emitted).
func (l *legacyLoose) Flush(dst []byte) ([]byte, *Hit) {
	return l.feed(dst, nil, true)
}

func (l *legacyLoose) feed(dst, text []byte, final bool) ([]byte, *Hit) {
	if l.cut != nil {
		return dst, l.cut
	}
	b := text
	if len(l.held) > 0 {
		l.buf = append(append(l.buf[:0], l.held...), text...)
		b = l.buf
		l.held = l.held[:0]
	}
	// chars/offs: the current run, folded, with each character's offset in b (−1: emitted by
	// an earlier Feed). Only the last MarkerChars are kept.
	var charsArr [2 * MarkerChars]byte
	var offsArr [2 * MarkerChars]int
	chars, offs := charsArr[:0], offsArr[:0]
	for _, c := range l.run {
		chars, offs = append(chars, c), append(offs, -1)
	}
	start := len(dst)
	for i := 0; i < len(b); {
		c, skip, size := legacyFold(b[i:])
		switch {
		case skip:
		case c == 0:
			chars, offs = chars[:0], offs[:0]
		default:
			if len(chars) == cap(chars) {
				n := copy(chars, chars[len(chars)-(MarkerChars-1):])
				copy(offs, offs[len(offs)-(MarkerChars-1):])
				chars, offs = chars[:n], offs[:n]
			}
			chars, offs = append(chars, c), append(offs, i)
			if n := len(chars); n >= LooseMin {
				w := n - LooseMin
				if cl, victim, epoch := l.classifyWindow(chars[w:]); cl == legacyForeign {
					emit := legacyFirstOffset(offs[w:], i)
					dst = append(dst, b[:emit]...)
					h := l.hit(dst[start:], chars[w:], victim, epoch)
					l.cut = &h
					return dst, l.cut
				}
			}
		}
		i += size
	}
	hold := len(b)
	if !final {
		// The earliest trailing window of FragmentMin..LooseMin−1 characters that still agrees
		// with a foreign marker is held back.
		n := len(chars)
		for w := max(0, n-(LooseMin-1)); w <= n-FragmentMin; w++ {
			if cl, _, _ := l.classify(chars[w:]); cl == legacyForeign {
				hold = legacyFirstOffset(offs[w:], len(b))
				break
			}
		}
		if len(b)-hold > legacyHoldCap {
			// Padding a candidate with invisible characters past the cap: treat it as the leak
			// it is built to look like.
			dst = append(dst, b[:hold]...)
			h := l.hit(dst[start:], chars[max(0, n-(LooseMin-1)):], "", 0)
			l.cut = &h
			return dst, l.cut
		}
	}
	dst = append(dst, b[:hold]...)
	l.held = append(l.held, b[hold:]...)
	// What the next Feed continues: the run's characters before the held part (the held bytes
	// are folded again then). A held window may begin in characters emitted earlier, so those
	// stay in the run.
	end := len(chars)
	for end > 0 && offs[end-1] >= hold {
		end--
	}
	l.run = append(l.run[:0], chars[max(0, end-(LooseMin-1)):end]...)
	l.remember(dst[start:])
	return dst, nil
}

// legacyFirstOffset is the first offset ≥ 0 in offs (the first character of a window this Feed has not
// emitted yet), or def when every character was emitted earlier.
func legacyFirstOffset(offs []int, def int) int {
	for _, o := range offs {
		if o >= 0 {
			return o
		}
	}
	return def
}

func (l *legacyLoose) remember(out []byte) {
	l.hist = append(l.hist, out...)
	if len(l.hist) > contextSide {
		l.hist = append(l.hist[:0], l.hist[len(l.hist)-contextSide:]...)
	}
}

// hit builds the incident's Hit: the matched characters (folded) and the redacted text before
// them (what follows may hold the rest of the marker in some disguise, so it is left out).
func (l *legacyLoose) hit(before, match []byte, victim string, epoch uint64) Hit {
	left := append(append([]byte{}, l.hist...), before...)
	if len(left) > contextSide {
		left = left[len(left)-contextSide:]
	}
	for len(left) > 0 && !utf8.RuneStart(left[0]) {
		left = left[1:]
	}
	ctx := append(RedactAll(left), "[marker]"...)
	return Hit{Marker: string(match), Victim: victim, Epoch: epoch, Context: string(ctx)}
}
