// Package disguise rewrites text the ways issue 31 found a hostile engine can hide another
// tenant's prompt text from a reader that folds only case and white space, while a person (or a
// client that renders it) still reads the same text. Tests only: the fingerprint package's and
// the gateway's hostile-engine tests share one list.
package disguise

import (
	"strings"
	"unicode/utf8"
)

// Disguise is one rewriting of text.
type Disguise struct {
	Name string
	Func func(string) string
}

// All is every disguise of issue 31.
func All() []Disguise {
	return []Disguise{
		{"zero-width space every 20 characters", every(20, "\u200b")},
		{"zero-width space between words", func(s string) string { return strings.ReplaceAll(s, " ", "\u200b") }},
		{"soft hyphen every 20 characters", every(20, "\u00ad")},
		{"word joiner between words", func(s string) string { return strings.ReplaceAll(s, " ", " \u2060") }},
		{"cyrillic look-alikes", strings.NewReplacer("a", "а", "c", "с", "e", "е", "o", "о", "p", "р", "x", "х", "y", "у", "i", "і",
			"A", "А", "B", "В", "C", "С", "E", "Е", "H", "Н", "K", "К", "M", "М", "O", "О", "P", "Р", "T", "Т", "X", "Х").Replace},
		{"fullwidth", func(s string) string {
			var b strings.Builder
			for _, r := range s {
				if r > ' ' && r < 0x7F {
					r += 0xFEE0
				}
				b.WriteRune(r)
			}
			return b.String()
		}},
		{"combining marks", func(s string) string {
			var b strings.Builder
			for i, r := range s {
				b.WriteRune(r)
				if r > ' ' && i%3 == 0 {
					b.WriteRune(0x0301 + rune(i%5)) // acute, tilde, macron, overline, breve above
				}
			}
			return b.String()
		}},
		{"dash every 20 characters", every(20, "-")},
		{"&#32; for spaces", func(s string) string { return strings.ReplaceAll(s, " ", "&#32;") }},
	}
}

// every inserts sep after every n characters of s.
func every(n int, sep string) func(string) string {
	return func(s string) string {
		var b strings.Builder
		for i, c := 0, 0; i < len(s); c++ {
			if c > 0 && c%n == 0 {
				b.WriteString(sep)
			}
			_, size := utf8.DecodeRuneInString(s[i:])
			b.WriteString(s[i : i+size])
			i += size
		}
		return b.String()
	}
}
