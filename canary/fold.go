package canary

//go:generate go run ./internal/genfold

import (
	"bytes"
	"html"
	"sort"
	"unicode"
	"unicode/utf8"
)

// Folding: how the detector reads text, as a person reading it would read a marker. Each
// character reads as marker characters (in classes, see fold_table.go), sits between them as a
// separator (spaces, dashes, dots, zero-width and other format characters, combining marks),
// or breaks a run. HTML character references (named and numeric) and JSON \u escapes written
// in the text read as the characters they stand for, so "&#107;" and "\u006b" are a k. Encodings
// a client must decode on purpose (base64, percent-encoding) are not read.

// asciiKind classifies a byte: 1+class for a marker character, kindSep, kindAmp ('&'),
// kindEsc ('\\'), kindWide (a non-ASCII lead or continuation byte), 0 for a byte that breaks a run.
var asciiKind = func() (t [256]uint8) {
	for c := 0; c < 128; c++ {
		if r := foldASCIIReading[c]; r != 0 {
			t[c] = 1 + uint8(b32val[r])
		}
	}
	for _, c := range []byte(" \t\n\r-._") {
		t[c] = kindSep
	}
	t['&'] = kindAmp
	t['\\'] = kindEsc
	for c := 0x80; c < 0x100; c++ {
		t[c] = kindWide
	}
	return t
}()

const (
	kindBreak = 0
	kindSep   = 64 + iota
	kindAmp
	kindEsc
	kindWide
)

// bmpFold is foldRune for the Basic Multilingual Plane, one lookup instead of two binary
// searches (CJK text is mostly characters that break a run): 0 breaks, 1 is a separator, 2+i
// reads as foldReadings[i].
var bmpFold = func() []uint16 {
	t := make([]uint16, 0x10000)
	for i, r := range foldRunes {
		if r < 0x10000 {
			t[r] = uint16(2 + i)
		}
	}
	for _, sp := range foldSeparators {
		for r := sp[0]; r <= sp[1] && r < 0x10000; r++ {
			t[r] = 1
		}
	}
	return t
}()

// foldRune reads one non-ASCII character: its classes (as marker characters, 1 to 4), or sep.
func foldRune(r rune) (reading string, sep bool) {
	if r < 0x10000 {
		switch v := bmpFold[r]; v {
		case 0:
			return "", false
		case 1:
			return "", true
		default:
			return foldReadings[v-2], false
		}
	}
	if i := sort.Search(len(foldRunes), func(i int) bool { return foldRunes[i] >= r }); i < len(foldRunes) && foldRunes[i] == r {
		return foldReadings[i], false
	}
	i := sort.Search(len(foldSeparators), func(i int) bool { return foldSeparators[i][1] >= r })
	return "", i < len(foldSeparators) && foldSeparators[i][0] <= r
}

// maxEscape bounds an HTML reference or JSON escape pair ("&CounterClockwiseContourIntegral;",
// "\ud835\udc1a").
const maxEscape = 34

// escapeAt reads an HTML character reference or a JSON \u escape at b[0] ('&' or '\\'). It
// returns the text it stands for and its length; n == 0 when b does not begin one. partial: b
// may begin one that continues past its end (only then is more text worth waiting for).
func escapeAt(b []byte) (text string, n int, partial bool) {
	if b[0] == '&' {
		for j := 1; j < len(b) && j < maxEscape; j++ {
			c := b[j]
			switch {
			case c == ';':
				s := string(b[:j+1])
				if u := html.UnescapeString(s); u != s {
					return u, j + 1, false
				}
				return "", 0, false
			case c == '#' && j == 1, c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			default:
				return "", 0, false
			}
		}
		return "", 0, len(b) < maxEscape
	}
	r, n, partial := jsonEscape(b)
	if n == 0 {
		return "", 0, partial
	}
	if utf16Surrogate(r) && r < 0xDC00 {
		if len(b) == n {
			return "", 0, true // the low half may follow
		}
		r2, n2, partial2 := jsonEscape(b[n:])
		if n2 == 0 {
			return "", 0, partial2
		}
		if r2 >= 0xDC00 && r2 <= 0xDFFF {
			return string(rune(0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00))), n + n2, false
		}
	}
	if utf16Surrogate(r) {
		return "", 0, false
	}
	return string(r), n, false
}

func utf16Surrogate(r rune) bool { return r >= 0xD800 && r <= 0xDFFF }

// jsonEscape reads "\uXXXX" at b.
func jsonEscape(b []byte) (r rune, n int, partial bool) {
	if len(b) < 2 {
		return 0, 0, len(b) == 1 && b[0] == '\\'
	}
	if b[0] != '\\' || b[1] != 'u' {
		return 0, 0, false
	}
	for j := 2; j < 6; j++ {
		if j >= len(b) {
			return 0, 0, true
		}
		c := b[j]
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		default:
			return 0, 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, 6, false
}

// foldText reads s (the text of an escape) as a reader would: its classes, or sep/break.
func foldText(s string) (reading string, sep bool) {
	if len(s) == 1 && s[0] < utf8.RuneSelf {
		switch k := asciiKind[s[0]]; {
		case k >= 1 && k <= 32:
			return string(b32alphabet[k-1]), false
		case k == kindSep:
			return "", true
		}
		return "", false
	}
	r, size := utf8.DecodeRuneInString(s)
	if size != len(s) || r < utf8.RuneSelf {
		return "", false
	}
	return foldRune(r)
}

// readUnit reads the character (or escape) at b[0]: the marker characters it reads as (as
// b32alphabet bytes, classes), or sep, or neither (a break); its size. wait: b may begin an
// escape that continues past its end (final: no more text comes, so it does not).
func readUnit(b []byte, final bool) (reading string, sep bool, size int, wait bool) {
	reading, _, sep, size, wait = foldUnit(b, final)
	return reading, sep, size, wait
}

// foldUnit is readUnit that also says which character a break is (brk: the character, or the
// first of an escape's text), for the prompt-text fingerprints, which read every character.
func foldUnit(b []byte, final bool) (reading string, brk rune, sep bool, size int, wait bool) {
	switch kd := asciiKind[b[0]]; {
	case kd >= 1 && kd <= 32:
		return b32alphabet[kd-1 : kd], 0, false, 1, false
	case kd == kindSep:
		return "", 0, true, 1, false
	case kd == kindBreak:
		return "", rune(b[0]), false, 1, false
	case kd == kindWide:
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			return "", utf8.RuneError, false, 1, false
		}
		reading, sep = foldRune(r)
		return reading, r, sep, size, false
	}
	s, n, partial := escapeAt(b)
	if n == 0 {
		return "", rune(b[0]), false, 1, partial && !final
	}
	reading, sep = foldText(s)
	r, _ := utf8.DecodeRuneInString(s)
	return reading, r, sep, n, false
}

// The folded reading shared with the prompt-text fingerprints (package fingerprint): a reply
// that disguises another tenant's prompt the ways a marker can be disguised (look-alikes,
// compatibility forms, HTML references and \u escapes, separators and format characters
// sprinkled in, combining marks) reads the same as the prompt did. Both sides (the prompt
// recorded, the reply scanned) fold through FoldByte and FoldUnit.

// Folded-byte codes (FoldByte): a separator reads as nothing; FoldSlow needs FoldUnit.
const (
	FoldSkip = 0
	FoldSlow = 0xFF
)

// foldedByte is FoldByte's table.
var foldedByte = func() (t [256]byte) {
	for c := 0; c < 256; c++ {
		switch kd := asciiKind[c]; {
		case kd >= 1 && kd <= 32:
			t[c] = b32alphabet[kd-1]
		case kd == kindSep:
			t[c] = FoldSkip
		case kd == kindBreak:
			t[c] = byte(c) // (ASCII: kindWide covers 0x80 and above)
		default:
			t[c] = FoldSlow
		}
	}
	return t
}()

// FoldByte is how both detectors read one byte of text: the folded ASCII character (a marker
// character's class, or the byte itself when it reads as none: digits 8 and 9, punctuation),
// FoldSkip for a separator (white space, '-', '.', '_'), FoldSlow for a byte that begins a
// character or escape FoldUnit reads (non-ASCII, '&', '\\').
func FoldByte(c byte) byte { return foldedByte[c] }

// FoldUnit reads the character or escape at b[0] as both detectors read it: the folded
// characters it stands for (reading: marker-character classes, 1 to 4), else the one character
// it is (r: lower case, fullwidth ASCII forms as ASCII), else nothing (a separator: reading ""
// and r 0); size is the bytes read. wait: b may begin an escape that continues past its end
// (final: no more text comes).
func FoldUnit(b []byte, final bool) (reading string, r rune, size int, wait bool) {
	reading, r, sep, size, wait := foldUnit(b, final)
	if reading != "" || sep || wait {
		return reading, 0, size, wait
	}
	if r >= 0xFF01 && r <= 0xFF5E {
		r -= 0xFEE0 // fullwidth ASCII punctuation and digits (letters have readings)
		if c := foldedByte[r]; c != FoldSlow {
			if c == FoldSkip {
				return "", 0, size, false
			}
			return "", rune(c), size, false
		}
		return "", r, size, false
	}
	return "", unicode.ToLower(r), size, false
}

// Inert says whether s cannot hold a marker, a fragment the detector withholds, or a disguise of
// one: ASCII with no character reference or escape, no "KVG", and no run of HoldMin characters
// that read as marker characters (separators between them included). Most ids, names and short
// words are inert and need no scanner.
func Inert(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		switch kd := asciiKind[s[i]]; {
		case kd >= 1 && kd <= 32:
			if run++; run >= HoldMin {
				return false
			}
		case kd == kindSep:
		case kd == kindBreak:
			run = 0
		default: // non-ASCII, '&', '\\'
			return false
		}
		if s[i] == 'K' && i+2 < len(s) && s[i+1] == 'V' && s[i+2] == 'G' {
			return false
		}
	}
	return true
}

// LongestRun is the longest run of consecutive characters of marker's body (from any offset, in
// either direction) that a reader recovers from text, read as the detector reads it: what text
// gives away of the marker. Tests use it to check what reached a client.
func LongestRun(text, marker string) int {
	var view []byte
	b := []byte(text)
	for i := 0; i < len(b); {
		reading, sep, size, _ := readUnit(b[i:], true)
		switch {
		case reading != "":
			view = append(view, reading...)
		case !sep:
			view = append(view, ' ')
		}
		i += size
	}
	body := []byte(marker[len(MarkerPrefix):])
	for i, c := range body {
		body[i] = b32alphabet[classIdx[c]]
	}
	rev := make([]byte, len(body))
	for i, c := range body {
		rev[len(body)-1-i] = c
	}
	best := 0
	for _, s := range [][]byte{body, rev} {
		for off := 0; off < len(s); off++ {
			for n := len(s) - off; n > best; n-- {
				if bytes.Contains(view, s[off:off+n]) {
					best = n
					break
				}
			}
		}
	}
	return best
}
