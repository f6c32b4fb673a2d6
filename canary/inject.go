package canary

import "unicode/utf8"

// Placement of the marker, and what each does to the engine's prefix cache (radix cache in SGLang):
//
//   - system_end (InjectSystemEnd, the default for chat): the marker goes at the end of the system
//     message. Everything before it (a system prompt shared by all tenants) stays a shared cached
//     prefix; only what follows the marker is cached per tenant. Since markers rotate every epoch,
//     the per-tenant part is recomputed once per epoch.
//   - prefix (InjectPrefix, the default for completions and /generate text): the marker is the
//     first thing in the prompt, so every cached prefix becomes per-tenant (and per-epoch): no
//     sharing between tenants at all. That also removes the cross-tenant cache hits a buggy
//     engine could mis-serve, at the cost of prefill work.
//   - every_bytes (InjectEvery, in addition to one of the above): repetitions through the text, so a
//     reply that reads only part of a foreign prompt still meets a marker. Each repetition splits
//     the prompt's cacheable prefix at that point, per tenant.
//
// Every injection is the marker plus at most 16 bytes of framing, whitespace-delimited so that the
// tokenizer sees it as its own words and the model is likely to copy it whole.

// InjectSystemEnd appends the marker to a system message's content after a blank line ("\n\n",
// 2 bytes of framing). An empty content becomes the marker alone (the gateway adds a system
// message when there is none).
func InjectSystemEnd(content, marker string) string {
	if content == "" {
		return marker
	}
	return content + "\n\n" + marker
}

// InjectPrefix puts the marker before a completions or /generate prompt, followed by a blank line.
func InjectPrefix(prompt, marker string) string {
	return marker + "\n\n" + prompt
}

// everyLookahead is how far past the everyBytes point InjectEvery looks for whitespace before it
// frames the marker with its own spaces at a character boundary (text without spaces, like
// Chinese or base64, would otherwise never get a repetition).
const everyLookahead = 256

// InjectEvery repeats the marker through text, once after every everyBytes bytes of the original
// text. It returns text unchanged when everyBytes ≤ 0 (the one placement is done by
// InjectSystemEnd or InjectPrefix). A repetition goes right after a whitespace byte, as marker +
// " "; when no whitespace comes within 256 bytes it goes at the next UTF-8 character boundary as
// " " + marker + " ". It never splits a UTF-8 sequence, and no repetition is added at the very
// end of the text.
func InjectEvery(text, marker string, everyBytes int) string {
	if everyBytes <= 0 || len(text) <= everyBytes {
		return text
	}
	out := make([]byte, 0, len(text)+(len(text)/everyBytes)*(len(marker)+2))
	last := 0 // start of the not yet copied text
	next := everyBytes
	for next < len(text) {
		pos := -1
		framed := false
		// Insert after the first whitespace at or after next-1 (so the marker starts on a word).
		limit := next + everyLookahead
		if limit > len(text) {
			limit = len(text)
		}
		for i := next; i < limit; i++ {
			if isSpace(text[i-1]) {
				pos = i
				break
			}
		}
		if pos < 0 {
			if limit == len(text) {
				break // nothing but the tail left: no repetition at the very end
			}
			pos = limit
			for pos < len(text) && !utf8.RuneStart(text[pos]) {
				pos++
			}
			if pos >= len(text) {
				break
			}
			framed = true
		}
		out = append(out, text[last:pos]...)
		if framed {
			out = append(out, ' ')
		}
		out = append(out, marker...)
		out = append(out, ' ')
		last = pos
		next = pos + everyBytes
	}
	out = append(out, text[last:]...)
	return string(out)
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\t' || c == '\r'
}
