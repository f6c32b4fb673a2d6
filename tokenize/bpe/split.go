package bpe

import (
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizer patterns this package implements by hand. They use a lookahead (`\s+(?!\S)`)
// that Go's regexp lacks, and a hand-written scanner is many times faster than a backtracking
// regex engine anyway. The scanner follows the regex semantics of Python's `regex` and of Rust's
// tokenizers (leftmost alternative first, greedy with backtracking), with \s the Unicode
// White_Space property (Go's unicode.IsSpace) and \p{L}, \p{N}, \p{M} Go's Unicode tables.
const (
	// PatternCl100k is cl100k_base's pattern, which Llama 3's tokenizer.json also uses.
	PatternCl100k = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternQwen2 is Qwen2's and Qwen3's: cl100k_base's with one digit per pre-token.
	PatternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternO200k is o200k_base's: words split at case changes, contractions kept with them.
	PatternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// DeepSeek V3's pre-tokenizer is a sequence of three Split steps (each Isolated: matches and the
// text between them both become pieces, and each step splits the pieces of the one before).
const (
	PatternDeepSeekDigits = `\p{N}{1,3}`
	PatternDeepSeekCJK    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	PatternDeepSeekWords  = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// Splitter cuts text into pre-tokens, as one of the known patterns (or sequences of them) does.
type Splitter struct {
	pattern   string
	o200k     bool
	deepseek  bool
	maxDigits int
	ascii     bool // asciiFast applies (cl100k_base's and Qwen2's patterns)
}

// Fast returns the end of the pre-token at s[i] when the ASCII fast path can tell (see Next for
// s and i), else 0. Counter calls it before Next: one call fewer for most pre-tokens.
func (sp *Splitter) Fast(s string, i int) int {
	if !sp.ascii {
		return 0
	}
	return asciiFast(s, i)
}

// NewSplitter returns the splitter of pattern, which must be one of the known patterns exactly:
// another pattern is refused, not approximated (a different split is a different count).
func NewSplitter(pattern string) (*Splitter, error) {
	bmpOnce.Do(fillBMP)
	switch pattern {
	case PatternCl100k:
		return &Splitter{pattern: pattern, maxDigits: 3, ascii: true}, nil
	case PatternQwen2:
		return &Splitter{pattern: pattern, maxDigits: 1, ascii: true}, nil
	case PatternO200k:
		return &Splitter{pattern: pattern, o200k: true, maxDigits: 3}, nil
	}
	return nil, fmt.Errorf("unsupported pre-tokenizer pattern %q (supported: the cl100k_base/Llama 3, Qwen2/Qwen3 and o200k_base patterns, and DeepSeek V3's sequence)", pattern)
}

// NewSequenceSplitter returns the splitter of a sequence of Split steps (each Isolated), which
// must be a known sequence exactly: DeepSeek V3's (PatternDeepSeekDigits, PatternDeepSeekCJK,
// PatternDeepSeekWords). One pattern alone is NewSplitter's.
func NewSequenceSplitter(patterns []string) (*Splitter, error) {
	if len(patterns) == 1 {
		return NewSplitter(patterns[0])
	}
	bmpOnce.Do(fillBMP)
	if len(patterns) == 3 && patterns[0] == PatternDeepSeekDigits && patterns[1] == PatternDeepSeekCJK && patterns[2] == PatternDeepSeekWords {
		return &Splitter{pattern: strings.Join(patterns, " then "), deepseek: true}, nil
	}
	return nil, fmt.Errorf("unsupported sequence of pre-tokenizer patterns %q (supported: DeepSeek V3's)", patterns)
}

// Pattern is the regex the splitter implements (a sequence's, joined by " then ").
func (sp *Splitter) Pattern() string { return sp.pattern }

// Outer returns the end of the outer piece that starts at s[i]: the earlier steps' piece, which
// the last step (Next) splits on its own, as if it were the whole text; len(s) for a single
// pattern. Counting pieces one outer piece at a time keeps a sequence linear: each call scans
// only the piece it returns.
//
// For DeepSeek V3 the outer pieces are runs of 1 to 3 numbers (\p{N}{1,3}), runs of the CJK
// step's characters, and runs of anything else. Computing them in one scan, restarted at any
// piece boundary, is exact because no step splits an earlier step's match except at a boundary
// a restart reproduces: the CJK step's characters are never \p{N}, and the word step keeps a
// piece of numbers whole (no alternative matches a number unless a letter or mark follows it);
// it splits a CJK run only at its punctuation (U+30A0, U+30FB), and a run restarted there is the
// rest of the same run.
func (sp *Splitter) Outer(s string, i int) int {
	if !sp.deepseek {
		return len(s)
	}
	r, n := runeAt(s, i)
	j := i + n
	switch {
	case isNumber(r):
		for k := 1; k < 3 && j < len(s); k++ {
			r2, n2 := runeAt(s, j)
			if !isNumber(r2) {
				break
			}
			j += n2
		}
	case isDeepSeekCJK(r):
		for j < len(s) {
			r2, n2 := runeAt(s, j)
			if !isDeepSeekCJK(r2) {
				break
			}
			j += n2
		}
	default:
		for j < len(s) {
			r2, n2 := runeAt(s, j)
			if isNumber(r2) || isDeepSeekCJK(r2) {
				break
			}
			j += n2
		}
	}
	return j
}

// isDeepSeekCJK is [一-龥぀-ゟ゠-ヿ].
func isDeepSeekCJK(r rune) bool {
	return r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x30ff
}

// ASCII classes.
const (
	clLetter = 1 << iota
	clUpper
	clDigit
	clSpace
	clNewline // \r or \n (also clSpace)
)

var asciiClass = func() (t [128]uint8) {
	for c := 0; c < 128; c++ {
		switch {
		case c >= 'a' && c <= 'z':
			t[c] = clLetter
		case c >= 'A' && c <= 'Z':
			t[c] = clLetter | clUpper
		case c >= '0' && c <= '9':
			t[c] = clDigit
		case c == '\r' || c == '\n':
			t[c] = clSpace | clNewline
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			t[c] = clSpace
		}
	}
	return
}()

// Classes of the Basic Multilingual Plane's characters, from Go's Unicode tables: a table lookup
// where unicode.IsLetter and friends search range lists (most of the cost of splitting CJK text).
const (
	ucLetter = 1 << iota
	ucNumber
	ucSpace
	ucMark
	ucPunctSymbol
	ucUpperish // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	ucLowerish // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

// bmp holds the classes of U+0000 to U+FFFF (64 KiB), filled by the first NewSplitter: every
// function that reads it runs for a Splitter.
var (
	bmp     *[1 << 16]uint8
	bmpOnce sync.Once
)

func fillBMP() {
	t := new([1 << 16]uint8)
	for r := range rune(1 << 16) {
		var c uint8
		if unicode.IsLetter(r) {
			c |= ucLetter
		}
		if unicode.IsNumber(r) {
			c |= ucNumber
		}
		if unicode.IsSpace(r) {
			c |= ucSpace
		}
		if unicode.IsMark(r) {
			c |= ucMark
		}
		if unicode.IsPunct(r) || unicode.IsSymbol(r) {
			c |= ucPunctSymbol
		}
		if unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M) {
			c |= ucUpperish
		}
		if unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M) {
			c |= ucLowerish
		}
		t[r] = c
	}
	bmp = t
}

func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clLetter != 0
	}
	if r < 1<<16 {
		return bmp[r]&ucLetter != 0
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clDigit != 0
	}
	if r < 1<<16 {
		return bmp[r]&ucNumber != 0
	}
	return unicode.IsNumber(r)
}

func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clSpace != 0
	}
	if r < 1<<16 {
		return bmp[r]&ucSpace != 0
	}
	return unicode.IsSpace(r)
}

// isPunct is [^\s\p{L}\p{N}].
func isPunct(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// isPrefix is [^\r\n\p{L}\p{N}].
func isPrefix(r rune) bool { return r != '\r' && r != '\n' && !isLetter(r) && !isNumber(r) }

// isUpperish is o200k's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}].
func isUpperish(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clUpper != 0
	}
	if r < 1<<16 {
		return bmp[r]&ucUpperish != 0
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

// isLowerish is o200k's [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isLowerish(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&(clLetter|clUpper) == clLetter
	}
	if r < 1<<16 {
		return bmp[r]&ucLowerish != 0
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// contraction returns the length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i] (s[i] == '\”), 0 none.
func contraction(s string, i int) int {
	if i+1 >= len(s) {
		return 0
	}
	switch s[i+1] | 0x20 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && s[i+2]|0x20 == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && s[i+2]|0x20 == 'l' {
			return 3
		}
	}
	// U+017F LATIN SMALL LETTER LONG S case-folds to s.
	if i+2 < len(s) && s[i+1] == 0xC5 && s[i+2] == 0xBF {
		return 3
	}
	return 0
}

// letters is span(s, j, isLetter) with the ASCII case inline: most of prose.
func letters(s string, j int) int {
	for j < len(s) {
		c := s[j]
		if byteClass[c] == bcLetter {
			j++
			continue
		}
		if c < utf8.RuneSelf {
			return j
		}
		r, n := utf8.DecodeRuneInString(s[j:])
		if !isLetter(r) {
			return j
		}
		j += n
	}
	return j
}

// byteClass sorts bytes for the ASCII fast paths: ASCII letters; ASCII characters of
// [^\s\p{L}\p{N}] (punctuation, symbols, controls) other than the apostrophe, which may start a
// contraction; ASCII spaces other than \r and \n; and the rest (digits, \r, \n, the apostrophe,
// bytes of longer characters). Punctuation and spaces are [^\r\n\p{L}\p{N}], the optional
// one-character prefix before letters.
const (
	bcOther = iota
	bcLetter
	bcPunct
	bcSpace
)

var byteClass = func() (t [256]uint8) {
	for c := range 128 {
		switch cl := asciiClass[c]; {
		case cl&clLetter != 0:
			t[c] = bcLetter
		case cl&clNewline != 0, cl&clDigit != 0, c == '\'':
		case cl&clSpace != 0:
			t[c] = bcSpace
		default:
			t[c] = bcPunct
		}
	}
	return
}()

// asciiLetters is letters with its ASCII loop here (one call fewer per word).
func asciiLetters(s string, j int) int {
	for j < len(s) && byteClass[s[j]] == bcLetter {
		j++
	}
	if j < len(s) && s[j] >= utf8.RuneSelf {
		return letters(s, j)
	}
	return j
}

// isASCIIPunct is [^\s\p{L}\p{N}] for ASCII bytes, the apostrophe included.
func isASCIIPunct(c byte) bool { return byteClass[c] == bcPunct || c == '\'' }

// asciiFast matches cl100k_base's and Qwen2's pattern at s[i] where the answer depends on ASCII
// alone (most of prose and code): a word, a prefix character and a word, a run of punctuation
// (with a space before it) and its trailing newlines. 0 when the general path must decide.
func asciiFast(s string, i int) int {
	c := byteClass[s[i]]
	if c == bcLetter {
		return asciiLetters(s, i+1)
	}
	if c != bcPunct && c != bcSpace || i+1 >= len(s) {
		return 0
	}
	next := s[i+1]
	if byteClass[next] == bcLetter {
		return asciiLetters(s, i+2)
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`, when the next byte rules out a letter or number after the
	// prefix (ASCII, not a digit) and, for a space, starts the punctuation.
	if next >= utf8.RuneSelf || asciiClass[next]&clDigit != 0 {
		return 0
	}
	j := i + 1
	if c == bcSpace {
		if s[i] != ' ' || !isASCIIPunct(next) {
			return 0
		}
		j = i + 2
	}
	for j < len(s) && isASCIIPunct(s[j]) {
		j++
	}
	if j < len(s) && s[j] >= utf8.RuneSelf {
		return 0 // punctuation may go on in a longer character
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
		j++
	}
	return j
}

func (sp *Splitter) span(s string, j int, in func(rune) bool) int {
	for j < len(s) {
		r, n := runeAt(s, j)
		if !in(r) {
			break
		}
		j += n
	}
	return j
}

// Next returns the end of the pre-token that starts at s[i] (i < len(s)), within an outer piece
// (see Outer) that ends at len(s). s must be valid UTF-8.
func (sp *Splitter) Next(s string, i int) int {
	if sp.ascii {
		if j := asciiFast(s, i); j > 0 {
			return j
		}
	}
	r, n := runeAt(s, i)
	if sp.deepseek {
		return deepseekWord(s, i, r, n)
	}
	if sp.o200k {
		if j := sp.o200kWord(s, i, r, n); j > i {
			return j
		}
	} else {
		if r == '\'' {
			if k := contraction(s, i); k > 0 {
				return i + k
			}
		}
		if isLetter(r) {
			return letters(s, i+n)
		}
		if isPrefix(r) && i+n < len(s) {
			if r2, n2 := runeAt(s, i+n); isLetter(r2) {
				return letters(s, i+n+n2)
			}
		}
	}
	if isNumber(r) {
		j := i + n
		for k := 1; k < sp.maxDigits && j < len(s); k++ {
			r2, n2 := runeAt(s, j)
			if !isNumber(r2) {
				break
			}
			j += n2
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*` ([\r\n/]* for o200k)
	j := -1
	if isPunct(r) {
		j = i
	} else if r == ' ' && i+1 < len(s) {
		if r2, _ := runeAt(s, i+1); isPunct(r2) {
			j = i + 1
		}
	}
	if j >= 0 {
		j = sp.span(s, j, isPunct)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n' || sp.o200k && s[j] == '/') {
			j++
		}
		return j
	}
	return whitespace(s, i)
}

// whitespace matches `\s*[\r\n]+|\s+(?!\S)|\s+` at s[i] (a space): `\s*[\r\n]+` ends after
// the run's last newline; else `\s+(?!\S)` leaves the run's last character to the next
// pre-token (unless the run ends the text); else `\s+`.
func whitespace(s string, i int) int {
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		if c := s[end]; c < utf8.RuneSelf {
			cl := asciiClass[c]
			if cl&clSpace == 0 {
				break
			}
			if cl&clNewline != 0 {
				lastNL = end
			}
			lastStart = end
			end++
			continue
		}
		r2, n2 := runeAt(s, end)
		if !isSpace(r2) {
			break
		}
		if r2 == '\r' || r2 == '\n' {
			lastNL = end
		}
		lastStart = end
		end += n2
	}
	switch {
	case lastNL >= 0:
		return lastNL + 1
	case end == len(s) || lastStart == i:
		return end
	default:
		return lastStart
	}
}

// o200kWord matches o200k's two word alternatives at s[i] (r, of n bytes), returning i if neither
// matches.
func (sp *Splitter) o200kWord(s string, i int, r rune, n int) int {
	prefixed := isPrefix(r) && i+n < len(s)
	if prefixed {
		if j := sp.lowerWord(s, i+n); j > 0 {
			return sp.withContraction(s, j)
		}
	}
	if j := sp.lowerWord(s, i); j > 0 {
		return sp.withContraction(s, j)
	}
	if prefixed {
		if j := sp.upperWord(s, i+n); j > 0 {
			return sp.withContraction(s, j)
		}
	}
	if j := sp.upperWord(s, i); j > 0 {
		return sp.withContraction(s, j)
	}
	return i
}

// lowerWord matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at p: the end, 0 none.
func (sp *Splitter) lowerWord(s string, p int) int {
	a := sp.span(s, p, isUpperish)
	if b := sp.span(s, a, isLowerish); b > a {
		return b
	}
	// Backtrack: the last lower-ish character among the upper-ish ones ends the match.
	for k := a; k > p; {
		r, n := utf8.DecodeLastRuneInString(s[p:k])
		if isLowerish(r) {
			return k
		}
		k -= n
	}
	return 0
}

// upperWord matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* at p: the end, 0 none.
func (sp *Splitter) upperWord(s string, p int) int {
	a := sp.span(s, p, isUpperish)
	if a == p {
		return 0
	}
	return sp.span(s, a, isLowerish)
}

func (sp *Splitter) withContraction(s string, j int) int {
	if j < len(s) && s[j] == '\'' {
		return j + contraction(s, j)
	}
	return j
}

// isPunctSymbol is [\p{P}\p{S}].
func isPunctSymbol(r rune) bool {
	if r < utf8.RuneSelf {
		return r > ' ' && r < 0x7f && asciiClass[r]&(clLetter|clDigit) == 0
	}
	if r < 1<<16 {
		return bmp[r]&ucPunctSymbol != 0
	}
	return unicode.IsPunct(r) || unicode.IsSymbol(r)
}

// isLetterMark is [\p{L}\p{M}].
func isLetterMark(r rune) bool {
	if r < utf8.RuneSelf {
		return asciiClass[r]&clLetter != 0
	}
	if r < 1<<16 {
		return bmp[r]&(ucLetter|ucMark) != 0
	}
	return unicode.IsLetter(r) || unicode.IsMark(r)
}

// deepseekWord matches PatternDeepSeekWords at s[i] (r, of n bytes), or, where no alternative
// matches, returns the start of the next match (Isolated keeps the text between matches as a
// piece of its own).
func deepseekWord(s string, i int, r rune, n int) int {
	// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ (every ASCII punctuation and symbol)
	if r < utf8.RuneSelf && isPunctSymbol(r) && i+1 < len(s) && s[i+1] < utf8.RuneSelf && asciiClass[s[i+1]]&clLetter != 0 {
		j := i + 2
		for j < len(s) && s[j] < utf8.RuneSelf && asciiClass[s[j]]&clLetter != 0 {
			j++
		}
		return j
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+: with the one-character prefix if letters or
	// marks follow it, else without (possible only when r is a mark).
	if isDeepSeekPrefix(r) && i+n < len(s) {
		if r2, n2 := runeAt(s, i+n); isLetterMark(r2) {
			return spanRunes(s, i+n+n2, isLetterMark)
		}
	}
	if isLetterMark(r) {
		return spanRunes(s, i+n, isLetterMark)
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	j := -1
	if isPunctSymbol(r) {
		j = i
	} else if r == ' ' && i+1 < len(s) {
		if r2, _ := runeAt(s, i+1); isPunctSymbol(r2) {
			j = i + 1
		}
	}
	if j >= 0 {
		j = spanRunes(s, j, isPunctSymbol)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	if isSpace(r) {
		return whitespace(s, i)
	}
	// No alternative matches here: the piece runs to where one does. A character matches when it
	// is a space, a letter, a mark, punctuation or a symbol, or a prefix before a letter or mark.
	for j := i + n; j < len(s); {
		r2, n2 := runeAt(s, j)
		if isSpace(r2) || isLetterMark(r2) || isPunctSymbol(r2) {
			return j
		}
		if j+n2 < len(s) && isDeepSeekPrefix(r2) {
			if r3, _ := runeAt(s, j+n2); isLetterMark(r3) {
				return j
			}
		}
		j += n2
	}
	return len(s)
}

// isDeepSeekPrefix is [^\r\n\p{L}\p{P}\p{S}].
func isDeepSeekPrefix(r rune) bool {
	return r != '\r' && r != '\n' && !isLetter(r) && !isPunctSymbol(r)
}

func spanRunes(s string, j int, in func(rune) bool) int {
	for j < len(s) {
		r, n := runeAt(s, j)
		if !in(r) {
			break
		}
		j += n
	}
	return j
}
