package hf

import (
	"strings"
	"testing"
)

// Tokenizers this package cannot count exactly are refused with an error naming what is
// unsupported, never approximated.
func TestUnsupportedTokenizersAreRefused(t *testing.T) {
	vocab := `"vocab": {"a": 0}, "merges": []`
	byteLevel := `{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}`
	split := func(pattern string) string {
		return `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ` + pattern + `}, "behavior": "Isolated", "invert": false}, ` + byteLevel + `]}`
	}
	cfg := []byte(`{"chat_template": "{{ messages[0].content }}"}`)
	for _, c := range []struct{ json, mention string }{
		{`{"model": {"type": "WordPiece", ` + vocab + `}}`, `unsupported model type "WordPiece"`},
		{`{"model": {"type": "BPE", "byte_fallback": true, ` + vocab + `}}`, "byte_fallback"},
		{`{"normalizer": {"type": "Lowercase"}, "model": {"type": "BPE", ` + vocab + `}}`, "unsupported normalizer"},
		{`{"pre_tokenizer": ` + split(`"\\s+|\\w+"`) + `, "model": {"type": "BPE", ` + vocab + `}}`, "unsupported pre-tokenizer pattern"},
		{`{"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE", ` + vocab + `}}`, "unsupported pre_tokenizer"},
		{`{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false}, {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": false}, ` + byteLevel + `]}, "model": {"type": "BPE", ` + vocab + `}}`, "unsupported sequence of pre-tokenizer patterns"},
		{`{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, ` + byteLevel + `]}, "model": {"type": "BPE", ` + vocab + `}}`, `unsupported pre-tokenizer step "Digits"`},
		{`{"pre_tokenizer": ` + split(`"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"`) + `, "model": {"type": "BPE", ` + vocab + `}}`, "not a byte-level vocabulary"},
	} {
		_, err := parse("test", []byte(c.json), cfg)
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: err = %v, want it to mention %q", c.json, err, c.mention)
		}
	}
}
