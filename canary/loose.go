package canary

import (
	"unicode/utf8"
)

// A Scanner recognizes markers as they are injected: "KVG-" and lowercase base32. An engine (or
// a model copying stale text) can write the same characters another way that a reader still
// decodes: without the prefix, in any case, in compatibility forms (fullwidth ａ, mathematical
// bold 𝐚, circled ⓐ), in look-alike letters of other scripts (Cyrillic а, Greek ο), as HTML
// character references or JSON \u escapes, with separators between the characters (spaces,
// dashes, dots, zero-width characters, combining marks), reversed; and it can quote any part of
// a marker, not only its start (a stale page cut in the middle). Loose reads text that way
// (fold.go) and looks for any live marker's characters anywhere in it, statefully across events.
//
// Two lengths, counted in consecutive characters of one live marker body, from any offset, in
// either direction:
//
//   - HoldMin (8): from the 8th character of such a run on, nothing of it reaches the client
//     (it is replaced by Redacted, once per run), so a client never sees more than 7.
//   - LooseMin (12): the run is evidence of a leak; the reply is cut and the incident recorded.
//
// Without the prefix every position of the text is a candidate, so LooseMin is set by a
// false-alarm budget. A marker body is 20 base32 characters drawn by HMAC (5 uniform bits each,
// independent of any text), so a given window of N text characters equals a given N-character
// window of a marker with probability 32^−N (but see classes below). With M live markers there
// are M·(20−N+1) windows, read both ways, so the expected chance matches per scanned position are
// 2·M·(21−N)/32^N; a GB of text has at most 10^9 positions. At M = 10^6:
//
//	N = 11: 2·10^7 / 2^55    ≈ 5.6×10^-10 per position ≈ 0.56 per GB  (too many)
//	N = 12: 2·9×10^6 / 2^60  ≈ 1.6×10^-11 per position ≈ 1.6×10^-2 per GB (one in ~64 GB)
//	N = 13: 2·8×10^6 / 2^65  ≈ 4.3×10^-13 per position ≈ 4.3×10^-4 per GB
//
// The classes (i and l are one: capital I reads as both) make a text character that is i, l, I,
// 1 or | match two marker characters of 32, so each such character of a window doubles its
// chance; English has about one in ten, so the rate above grows by about 2^1.2 ≈ 2.3 on prose
// (3.7×10^-2 per GB at 10^6 markers, 3.7×10^-3 at 10^5). N = 12 keeps expected false alarms well
// below one per GB, while a leak of 12 characters is already 60 bits of a 100-bit marker.
//
// The same arithmetic for HoldMin gives the text that is redacted without a leak: 2·13·M/2^40 ≈
// 2.4×10^-6 per position at 10^5 markers (a few thousand 8-character runs per GB, each replaced
// by "[redacted]"): the price of never letting 8 characters through.
//
// Windows are looked up in sets of HoldMin-character windows (winSet: a one-word Bloom filter,
// then a bucketed open-addressed table), so the cost per character does not depend on the number
// of live markers. The per-character loop (scanFast) takes two marker characters a turn, the
// run's last 7 probed in the filter at the second; everything else goes to the slow path (step),
// which TestLooseFastPathAgreesWithSlowPath holds it to.
const LooseMin = 12

// Loose is the folded-text detector of one reply field. It is not safe for concurrent use.
// Own markers are not hits; the requester's echoes are not hits while the run stays within the
// characters the requester itself sent (any character beyond them counts as foreign).
type Loose struct {
	k      *Keyring
	tenant string
	echoes []string
	// pend is a partial escape ("&#10", "\u00") that ended the last Feed or FeedAll, read again
	// with the next text; its first pendDone bytes were already emitted (or withheld): all of a
	// FeedAll's, none of a Feed's unless they were a FeedAll's before it (Feed after FeedAll).
	pend     []byte
	pendDone int
	buf      []byte
	run      runState
	cut      *Hit
	hist     []byte // the last bytes emitted, for Hit.Context
	// collect, when set, is told every run of HoldMin or more characters of a live marker (the
	// prompt scan of FindMarkerFragments); nothing is ever dropped or cut then.
	collect func(rec int, lo, n int)
	me      uint32 // the requester's tenant index (noTenant when unknown)
	// slowOnly (tests): every character goes through the slow path, the reference that the fast
	// path must agree with byte for byte.
	slowOnly bool
	r        *ring // the keyring state of this Feed (and the run's stretches, by recsGen)
	recsGen  uint64
}

// noTenant is the tenant index of a requester the keyring does not know.
const noTenant = ^uint32(0)

// runState is the current run of marker characters and the marker stretches it agrees with.
type runState struct {
	fk       uint64 // the last HoldMin characters' classes, the newest in the low bits
	rk       uint64 // the same backwards: the newest in the high bits
	n        int    // characters in the run
	al       []align
	dropping bool // the run's characters are being withheld (Redacted was emitted)
	// slow: the next character of the run goes to the exact check (the 7-character window that
	// ends here is a live marker's, so the 8-character one ending there may be).
	slow bool
}

// align is a stretch of one live marker's body that the run's last n characters spell.
type align struct {
	rec     int32
	lo, n   int8 // marker characters [lo, lo+n)
	rev     bool // spelled backwards: the newest character is body[lo]
	own     bool
	echoed  uint32 // bit i: the requester sent character i of this marker itself
	foreign bool   // echoed does not cover [lo, lo+n)
}

// NewLoose returns a folded-text detector for replies to tenant. echoes are what the requester's
// prompt held of other tenants' markers (FindMarkerFragments).
func (k *Keyring) NewLoose(tenant string, echoes []string) *Loose {
	return &Loose{k: k, tenant: tenant, echoes: echoes}
}

// Reset prepares l for a new field, keeping its buffers.
func (l *Loose) Reset(tenant string, echoes []string) {
	l.tenant, l.echoes = tenant, echoes
	l.pend, l.pendDone, l.cut, l.hist = l.pend[:0], 0, nil, l.hist[:0]
	l.run.reset()
}

func (r *runState) reset() {
	r.fk, r.rk, r.n, r.al, r.dropping, r.slow = 0, 0, 0, r.al[:0], false, false
}

// Feed takes the next text of the field and appends to dst what may be emitted now: the text,
// with every run of HoldMin or more characters of a foreign marker withheld from its HoldMin-th
// character on (Redacted in its place). On a leak it returns the hit; the reply must be cut.
func (l *Loose) Feed(dst, text []byte) ([]byte, *Hit) {
	return l.feed(dst, text, false, false)
}

// Flush settles a held partial escape at the end of the field.
func (l *Loose) Flush(dst []byte) ([]byte, *Hit) {
	return l.feed(dst, nil, true, false)
}

func (l *Loose) feed(dst, text []byte, final, all bool) ([]byte, *Hit) {
	if l.cut != nil {
		return dst, l.cut
	}
	b := text
	floor := 0 // b[:floor] was emitted (or withheld) before
	if len(l.pend) > 0 {
		l.buf = append(append(l.buf[:0], l.pend...), text...)
		b = l.buf
		floor = l.pendDone
		l.pend, l.pendDone = l.pend[:0], 0
	}
	r := l.k.ring()
	l.r = r
	l.me = noTenant
	if i, ok := r.tenantIdx[l.tenant]; ok {
		l.me = i
	}
	if l.recsGen != r.recsGen {
		// Markers moved in the keyring (a refresh): the stretches being tracked are found again
		// by the next probe of the run's last characters (a withheld run stays withheld).
		l.run.al = l.run.al[:0]
		l.recsGen = r.recsGen
	}
	start := len(dst)
	emit := floor // b[emit:] is not copied to dst yet
	end := len(b)
	for i := 0; i < len(b); {
		if !l.run.dropping && !l.run.slow && len(l.run.al) == 0 && !l.slowOnly {
			// The fast path: characters that no tracked stretch continues and whose windows are
			// in no live marker, with the run's state in registers.
			if j := l.fast(b, i); j > i {
				i = j
				continue
			}
		}
		kd := asciiKind[b[i]]
		if kd >= 1 && kd <= 32 {
			var h *Hit
			if dst, emit, h = l.unit(dst, b, emit, i, 1, b32alphabet[kd-1:kd]); h != nil {
				return l.stop(dst, h)
			}
			i++
			continue
		}
		switch kd {
		case kindSep:
			i++
			continue
		case kindBreak:
			l.run.reset()
			i++
			continue
		}
		reading, sep, size, wait := readUnit(b[i:], final)
		if wait {
			end = i // wait for the rest of a reference split across events
			break
		}
		switch {
		case reading != "":
			var h *Hit
			if dst, emit, h = l.unit(dst, b, emit, i, size, reading); h != nil {
				return l.stop(dst, h)
			}
		case !sep:
			l.run.reset()
		}
		i += size
	}
	if all {
		// The value ends here: all of it is emitted, and a partial escape at its end is read
		// again with the next value, which a client joins to it; while a run is withheld, the
		// partial escape is too (it may complete the run's next character).
		if l.run.dropping {
			dst = append(dst, b[emit:max(end, emit)]...)
		} else {
			dst = append(dst, b[emit:]...)
		}
		l.pend, l.pendDone = append(l.pend, b[end:]...), len(b)-end
	} else {
		// After a FeedAll the escape that waits may begin in what that value emitted (floor >
		// end): those bytes wait again, still counted as emitted.
		if end > emit {
			dst = append(dst, b[emit:end]...)
		}
		l.pend, l.pendDone = append(l.pend, b[end:]...), max(emit-end, 0)
	}
	l.remember(dst[start:])
	return dst, nil
}

// fast reads b from i while its characters are ASCII marker characters, separators, bytes that
// break a run, or 2- and 3-byte UTF-8 characters that separate or break (most of CJK), and the
// run's 7-character windows probed (at even lengths, see winSet) are in no live marker; it
// returns where it stopped (i when b[i] needs the slow path: a window that is a marker's, an
// escape, another character). The run's state stays in registers.
func (l *Loose) fast(b []byte, i int) int {
	r := l.r
	ff := fastFilter{fb: r.base.filter}
	if r.nbase < len(r.recs) {
		ff.fd = r.delta.filter
	}
	fk, n := l.run.fk, l.run.n
	j := i
	for {
		var stop int
		j, fk, n, stop = scanFast(b, j, fk, n, &ff)
		if stop == stopWide {
			k, broke := wideRun(b, j)
			if k == j {
				break // the slow path reads it
			}
			if broke {
				fk, n = 0, 0
			}
			j = k
			continue
		}
		if stop != stopFilter {
			break
		}
		// fk includes b[j], n does not.
		if r.hasWindow(runSetKey(fk, reversedKey(fk&winKeyMask))) {
			fk >>= 5 // the slow path takes this character: the run as it was before it
			break
		}
		// The filter passed falsely: the character is the run's, its window in no marker.
		n++
		j++
	}
	fk &= winKeyMask
	l.run.fk, l.run.rk, l.run.n = fk, reversedKey(fk), n
	return j
}

// fastFilter is what scanFast probes: the ring's filters (fd nil without a delta set). Their
// lengths are powers of two, so a word index is the hash masked by len−1 (winSet.filterWord),
// which also proves it in bounds.
type fastFilter struct {
	fb, fd []uint64
}

// reversedKey is a run's rk for its fk: the last HoldMin characters' classes read backwards.
func reversedKey(fk uint64) uint64 {
	var rk uint64
	for i := 0; i < HoldMin; i++ {
		rk, fk = rk<<5|fk&31, fk>>5
	}
	return rk
}

// Why scanFast stopped.
const (
	stopOther  = iota // the end of b, or something the slow path reads
	stopFilter        // the filter passed for b[j], a marker character not consumed
	stopWide          // b[j] is a non-ASCII byte
)

// scanFast is fast's loop, a leaf (no calls: its state stays in registers). It consumes b from j
// two marker characters at a time (one that makes the run's length odd, then one that makes it
// even, where the run's last 7 characters are probed in the filters), so the parity is where the
// code is, not a branch. Only fk is kept (fast derives rk from it). It stops at a marker character
// whose probe passed the filter (fk then includes it, n does not: the old fk need not stay
// live), at a
// non-ASCII byte (wideRun reads those) and before anything else the slow path reads.
func scanFast(b []byte, j int, fk uint64, n int, f *fastFilter) (int, uint64, int, int) {
	fb, fd := f.fb, f.fd
	if len(fb) == 0 {
		return j, fk, n, stopOther // not a ring's filter (newWinSet makes one word at least)
	}
	if n&1 != 0 {
		goto odd
	}
even:
	// n is even: the next marker character makes it odd (no probe).
	for uint(j) < uint(len(b)) {
		kd := asciiKind[b[j]]
		if kd-1 < 32 {
			x := uint64(kd - 1)
			fk, n = fk<<5|x, n+1
			j++
			goto odd
		}
		switch kd {
		case kindSep:
			j++
		case kindBreak:
			fk, n = 0, 0
			j++
		case kindWide:
			return j, fk, n, stopWide
		default:
			return j, fk, n, stopOther
		}
	}
	return j, fk, n, stopOther
odd:
	// n is odd: the next marker character makes it even; from HoldMin on its last 7 are probed.
	for uint(j) < uint(len(b)) {
		kd := asciiKind[b[j]]
		if kd-1 < 32 {
			x := uint64(kd - 1)
			nfk := fk<<5 | x // masked where it is used: one step less in the chain
			if n >= HoldMin-1 {
				// The filter holds every window both ways: the run's last 7 as read.
				h := nfk & setKeyMask * hashMul
				m := filterMask(h)
				if fb[h>>filterWordShift&uint64(len(fb)-1)]&m == m ||
					len(fd) > 0 && fd[h>>filterWordShift&uint64(len(fd)-1)]&m == m {
					return j, nfk, n, stopFilter
				}
			}
			fk, n = nfk, n+1
			j++
			goto even
		}
		switch kd {
		case kindSep:
			j++
		case kindBreak:
			fk, n = 0, 0
			j++
			goto even
		case kindWide:
			return j, fk, n, stopWide
		default:
			return j, fk, n, stopOther
		}
	}
	return j, fk, n, stopOther
}

// wideRun reads the valid 2- and 3-byte UTF-8 characters from b[j] on while they separate or
// break a run (most of CJK): it returns where it stopped and whether one of them broke the run.
// Anything else (a character that reads as marker characters, a 4-byte or invalid sequence) is
// left to the slow path.
func wideRun(b []byte, j int) (int, bool) {
	broke := false
	for {
		var ru rune
		var size int
		if j+2 < len(b) && b[j]-0xE0 < 0x10 && (b[j+1]^0x80)|(b[j+2]^0x80) < 0x40 {
			if breakLead3>>(b[j]&0x0F)&1 != 0 {
				// All 4096 characters of this lead byte break a run (CJK ideographs, Hangul):
				// no decoding, no table lookup.
				broke = true
				j += 3
				continue
			}
			ru = rune(b[j]&0x0F)<<12 | rune(b[j+1]&0x3F)<<6 | rune(b[j+2]&0x3F)
			if ru < 0x800 || uint32(ru)-0xD800 < 0x800 {
				return j, broke // overlong or a surrogate: not a character
			}
			size = 3
		} else if j+1 < len(b) && b[j]-0xC2 < 0x1E && b[j+1]^0x80 < 0x40 {
			ru, size = rune(b[j]&0x1F)<<6|rune(b[j+1]&0x3F), 2
		} else {
			return j, broke
		}
		switch bmpFold[ru] {
		case 0:
			broke = true
		case 1:
		default:
			return j, broke // reads as marker characters
		}
		j += size
	}
}

// breakLead3 has bit n set when every character of the 3-byte UTF-8 sequences led by 0xE0|n
// breaks a run (bmpFold 0). Not 0xE0 (overlong forms and other classes) nor 0xED (surrogates).
var breakLead3 = func() (m uint16) {
	for n := 1; n < 16; n++ {
		if n == 0xD {
			continue
		}
		all := true
		for _, v := range bmpFold[n<<12 : (n+1)<<12] {
			all = all && v == 0
		}
		if all {
			m |= 1 << n
		}
	}
	return m
}()

// unit takes one character of the text (b[i:i+size]) that reads as marker characters.
func (l *Loose) unit(dst, b []byte, emit, i, size int, reading string) ([]byte, int, *Hit) {
	wasDropping := l.run.dropping
	drop, ev := false, -1
	for j := 0; j < len(reading); j++ {
		d, e := l.step(uint8(b32val[reading[j]]))
		drop = drop || d
		if e >= 0 && ev < 0 {
			ev = e
		}
	}
	if ev >= 0 && l.collect == nil {
		if !wasDropping && i > emit {
			dst = append(dst, b[emit:i]...)
		}
		return dst, emit, l.evidence(dst, ev)
	}
	switch {
	case drop && !wasDropping:
		if i > emit {
			dst = append(dst, b[emit:i]...)
		}
		dst = append(dst, Redacted...)
		l.run.dropping = true
		emit = max(emit, i+size)
	case drop:
		emit = max(emit, i+size)
	case wasDropping:
		// The withheld run ended; the client sees Redacted before this character, so a new run
		// begins with it.
		l.run.reset()
		for j := 0; j < len(reading); j++ {
			l.step(uint8(b32val[reading[j]]))
		}
	}
	return dst, emit, nil
}

// push adds a character to the run when no window can be complete yet.
func (r *runState) push(x uint8) {
	r.fk = (r.fk<<5 | uint64(x)) & winKeyMask
	r.rk = r.rk>>5 | uint64(x)<<(winKeyBits-5)
	r.n++
}

// step adds one character (its class) to the run. drop: it belongs to a foreign stretch of
// HoldMin or more characters; evidence ≥ 0: the index in run.al of one of LooseMin or more.
func (l *Loose) step(x uint8) (drop bool, evidence int) {
	r := &l.run
	wasSlow := r.slow
	r.push(x)
	r.slow = false
	recs := l.r.recs
	kept := r.al[:0]
	for _, a := range r.al {
		body := &recs[a.rec].body
		if a.rev {
			if a.lo > 0 && uint8(classIdx[body[a.lo-1]]) == x {
				a.lo--
				a.n++
				kept = append(kept, l.judge(a))
			}
		} else if int(a.lo)+int(a.n) < MarkerChars && uint8(classIdx[body[int(a.lo)+int(a.n)]]) == x {
			a.n++
			kept = append(kept, l.judge(a))
		}
	}
	r.al = kept
	// The exact check where the 8 characters ending here may be a marker's window (see winSet:
	// at even lengths, and after an even length whose 7-character window is a marker's).
	if r.n >= HoldMin && (r.n&1 == 0 || wasSlow) && l.probe(r.fk, r.rk) && r.n&1 == 0 {
		r.slow = true // the next character's window holds this 7-character one
	}
	evidence = -1
	for i, a := range r.al {
		if a.own || !a.foreign {
			continue
		}
		drop = true
		if a.n >= LooseMin && evidence < 0 {
			evidence = i
		}
	}
	if l.collect != nil {
		for _, a := range r.al {
			l.collect(int(a.rec), int(a.lo), int(a.n))
		}
	}
	return drop, evidence
}

// probe adds the stretches of live markers that the run's last HoldMin characters (fk, and rk
// backwards) spell, forwards or backwards: the markers with a 7-character window equal to the
// run's last 7 characters (either way), checked one character further. found: the last 7
// characters are some live marker's window.
func (l *Loose) probe(fk, rk uint64) (found bool) {
	r := l.r
	return r.eachWindow(runSetKey(fk, rk), func(rec, off int) {
		m := &r.recs[rec]
		// Forwards the run's last 8 are body[off−1 : off+7]; backwards its newest character is
		// body[off] and its last 8 are body[off : off+8] read from the end.
		if off >= 1 && bodyWindowKey(m.body[off-1:off-1+HoldMin]) == fk {
			l.addAlign(rec, m, off-1, false)
		}
		if off+HoldMin <= MarkerChars && reversedWindowKey(m.body[off:off+HoldMin]) == fk {
			l.addAlign(rec, m, off, true)
		}
	})
}

// addAlign starts tracking a stretch [off, off+HoldMin) of marker rec, unless it already is
// (a stretch found earlier and extended to here). The table holds a window once per occurrence,
// so each stretch may be reported more than once.
func (l *Loose) addAlign(rec int, m *markerRec, off int, rev bool) {
	for _, a := range l.run.al {
		if int(a.rec) == rec && a.rev == rev && (rev && int(a.lo) == off || !rev && int(a.lo)+int(a.n)-HoldMin == off) {
			return
		}
	}
	a := align{rec: int32(rec), lo: int8(off), n: HoldMin, rev: rev, own: m.tenant == l.me}
	if !a.own && len(l.echoes) > 0 {
		a.echoed = echoedMask(l.echoes, &m.body)
	}
	l.run.al = append(l.run.al, l.judge(a))
}

// judge says whether a stretch holds a character the requester did not send itself.
func (l *Loose) judge(a align) align {
	span := uint32(1)<<uint(a.lo+a.n) - uint32(1)<<uint(a.lo)
	a.foreign = a.echoed&span != span
	return a
}

// echoedMask: which characters of the marker body the echo descriptors cover (see
// FindMarkerFragments: "KVG-" and the body with characters the prompt did not hold as '?').
func echoedMask(echoes []string, body *[MarkerChars]byte) uint32 {
	var m uint32
	for _, e := range echoes {
		if len(e) != MarkerLen {
			continue
		}
		d := e[len(MarkerPrefix):]
		var mask uint32
		agree := 0
		for i := 0; i < MarkerChars; i++ {
			if d[i] == '?' {
				continue
			}
			if d[i] != body[i] {
				mask, agree = 0, -1
				break
			}
			mask |= 1 << i
			agree++
		}
		if agree >= HoldMin {
			m |= mask
		}
	}
	return m
}

// evidence builds the hit for the stretch run.al[i] and cuts.
func (l *Loose) evidence(before []byte, i int) *Hit {
	a := l.run.al[i]
	m := &l.r.recs[a.rec]
	h := l.hit(before, m.body[a.lo:a.lo+a.n], l.r.tenants[m.tenant].name, m.epoch)
	return &h
}

func (l *Loose) stop(dst []byte, h *Hit) ([]byte, *Hit) {
	l.cut = h
	return dst, h
}

func (l *Loose) remember(out []byte) {
	if len(out) >= contextSide {
		// Only the end of a long output is kept: no second copy of all of it.
		l.hist = append(l.hist[:0], out[len(out)-contextSide:]...)
		return
	}
	l.hist = append(l.hist, out...)
	if len(l.hist) > contextSide {
		l.hist = append(l.hist[:0], l.hist[len(l.hist)-contextSide:]...)
	}
}

// hit builds the incident's Hit: the matched characters of the marker and the redacted text
// before them (what follows may hold the rest of the marker in some disguise, so it is left out).
func (l *Loose) hit(before, match []byte, victim string, epoch uint64) Hit {
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

// FeedAll is Feed for text that ends a value (the joined reading of values a client joins):
// all of it is emitted at once (what it withholds aside), nothing is held for the next value; an
// escape cut at its end is read again together with the next value, and the run carries on
// into it, as a client joins the values. Feed and FeedAll may follow each other on one Loose: a
// partial escape a FeedAll emitted is not emitted again by the Feed that completes it.
func (l *Loose) FeedAll(dst, text []byte) ([]byte, *Hit) {
	return l.feed(dst, text, false, true)
}
