package tokenize

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"
)

// FuzzCount checks, for any input and any stopAfter, with both libraries:
//   - Count never panics and n >= 0;
//   - a complete count is at most the byte bound of the text the engine would see: ByteBound(text)
//     for valid UTF-8, and for invalid UTF-8 ByteBound of the text with each bad sequence replaced
//     by U+FFFD (3 bytes), so at most 3·ByteBound(text);
//   - early exit keeps its contract: the exact count when it is <= stopAfter, else n > stopAfter
//     with complete=false;
//   - cutting valid text at every safe boundary leaves tiktoken-go's cl100k_base and o200k_base
//     counts unchanged (the claim the chunked count rests on);
//   - no input takes seconds.
//
// Run it with a short -fuzzminimizetime (e.g. 5s): each execution counts the input several
// times, so minimizing an interesting input can use the whole default 60 s.
func FuzzCount(f *testing.F) {
	for _, s := range []string{
		"", "\x00", "\xff", "\xed\xa0\x80", "\xe4\xb8", "\U0010FFFF", "hello world", "<|endoftext|>",
		"<|endoftext", "<|im_start|>user\nhi<|im_end|>\n", " ", "   x", "\r\n\r\n", "\n\t\n", "it's",
		"WE'LL", "a\u0301 b", "x\u00a0 y", "中文。测试", "word.\n\nnext", "1234567", "\t\t}\n",
		strings.Repeat("a", 3000), strings.Repeat(" ", 2500), strings.Repeat("<|endoftext|>", 100),
		strings.Repeat("é", 700), trickyText,
	} {
		f.Add(s, int16(-1))
		f.Add(s, int16(3))
	}
	encoders := []Encoder{mustEncoder(f, LibraryTiktokenGo, ""), mustEncoder(f, LibraryKvgate, "")}
	var codecs []tokenizer.Codec
	for _, e := range []tokenizer.Encoding{tokenizer.Cl100kBase, tokenizer.O200kBase} {
		codec, err := tokenizer.Get(e)
		if err != nil {
			f.Fatal(err)
		}
		codecs = append(codecs, codec)
	}
	f.Fuzz(func(t *testing.T, text string, stop16 int16) {
		stop := int(stop16)
		began := time.Now()
		defer func() {
			// Inputs are small; seconds would mean a quadratic path came back.
			if d := time.Since(began); d > 2*time.Second*raceSlowdown {
				t.Fatalf("slow input (%v, %d bytes): %q", d, len(text), text)
			}
		}()
		seen := strings.ToValidUTF8(text, "\uFFFD")
		for _, enc := range encoders {
			exact, complete := enc.Count(text, -1)
			if !complete || exact < 0 || exact > ByteBound(seen) {
				t.Fatalf("%s Count(%q, -1) = %d, %v; byte bound %d", enc.Name(), text, exact, complete, ByteBound(seen))
			}
			n, complete := enc.Count(text, stop)
			switch {
			case stop < 0 || exact <= stop:
				if n != exact || !complete {
					t.Fatalf("%s Count(%q, %d) = %d, %v; exact %d", enc.Name(), text, stop, n, complete, exact)
				}
			case n <= stop || complete:
				t.Fatalf("%s Count(%q, %d) = %d, %v; want > %d, false", enc.Name(), text, stop, n, complete, stop)
			}
		}
		if !utf8.ValidString(text) {
			return
		}
		for _, codec := range codecs {
			whole, _ := codec.Count(text)
			sum, start := 0, 0
			for i := 1; i <= len(text); i++ {
				if i == len(text) || isSafeBoundary(text, i) {
					k, _ := codec.Count(text[start:i])
					sum += k
					start = i
				}
			}
			if sum != whole {
				t.Fatalf("%s: cutting %q at every safe boundary: %d tokens, whole %d", codec.GetName(), text, sum, whole)
			}
		}
	})
}
