package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// Where text may be cut without changing its count.
//
// BPE merges never cross a pre-token, so cutting text exactly where the pre-tokenizer would cut
// anyway leaves the token count unchanged. For both cl100k_base and o200k_base, byte i starts a
// pre-token whatever follows when:
//   - text[i] is ' ' and the rune before it is not whitespace: no pattern lets a non-space
//     character be followed by a space inside one pre-token (spaces only start a pre-token or
//     belong to a whitespace run);
//   - text[i] is '\n' and the rune before it is a letter or a digit: letter and digit runs never
//     absorb a newline (punctuation runs do, `[^\s\p{L}\p{N}]+[\r\n]*`, so not after those);
//   - the rune at i is punctuation or a symbol (not whitespace, letter, digit, mark or apostrophe)
//     and the rune before it is a letter: the letter run ends there (o200k lets a word absorb a
//     contraction such as 's, hence no apostrophe; marks extend o200k's words).
// Cutting anywhere else (forcedCut) may split a pre-token, which can only shift the count by a
// token or so per cut; it is used only for runs with no boundary at all.

// isSpace is the conservative union of Go's and the regex engine's (.NET's) whitespace.
func isSpace(r rune) bool { return unicode.IsSpace(r) || unicode.Is(unicode.Z, r) }

// isSafeBoundary reports whether a piece may start at byte i of s (0 < i < len(s)).
func isSafeBoundary(s string, i int) bool {
	c := s[i]
	switch {
	case c == ' ':
		r, _ := utf8.DecodeLastRuneInString(s[:i])
		return !isSpace(r)
	case c == '\n':
		r, _ := utf8.DecodeLastRuneInString(s[:i])
		return unicode.IsLetter(r) || unicode.IsNumber(r)
	case c >= 0x80 && c < 0xC0:
		return false // a UTF-8 continuation byte: never cut inside a rune
	case c == '\'' || c < 0x21 || c == 0x7f:
		return false
	case c < 0x80 && (c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'z'):
		return false // an ASCII letter or digit continues or starts a run we must not cut
	}
	r, _ := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError || isSpace(r) || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.M, r) {
		return false
	}
	p, _ := utf8.DecodeLastRuneInString(s[:i])
	return unicode.IsLetter(p)
}

// forcedCut returns the largest rune start in (start, at], for runs that have no safe boundary.
func forcedCut(s string, start, at int) int {
	for i := at; i > start; i-- {
		if !utf8.RuneStart(s[i]) {
			continue
		}
		return i
	}
	return at // unreachable for valid UTF-8 when at-start >= utf8.UTFMax
}

// nextCut returns where the piece starting at start ends: the last safe boundary within target
// bytes, else the first one within maxRun bytes, else a forced cut at most maxRun bytes in. It
// returns len(s) once the rest fits in target. utf8.UTFMax <= target <= maxRun.
func nextCut(s string, start, target, maxRun int) int {
	end := start + target
	if end >= len(s) {
		return len(s)
	}
	// Backwards from target: ordinary text has a boundary within a few bytes, so this is cheap.
	for i := end; i > start; i-- {
		if isSafeBoundary(s, i) {
			return i
		}
	}
	limit := start + maxRun
	if limit >= len(s) {
		limit = len(s)
	}
	for i := end + 1; i < limit; i++ {
		if isSafeBoundary(s, i) {
			return i
		}
	}
	if limit == len(s) {
		return limit
	}
	return forcedCut(s, start, limit)
}
