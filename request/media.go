package request

// Text that spells the served model's media placeholder tokens. An engine's multimodal
// processor finds those tokens in the prompt and expands them, or fills them with the features
// of the request's images: spelled in text, they make it expect media the request does not
// carry, and the mismatch fails the request or the engine (CVE-2026-44222; transformers'
// "Image features and image tokens do not match"). No count is right for them (there is no
// image to expand), so they are refused: 400 naming the field, before any count.

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvgate/kvgate/apierr"
)

// mediaTemplate is a ChatTemplate that knows its model's media placeholder tokens (content →
// id; tokenize/hf's MediaTokens).
type mediaTemplate interface {
	MediaTokens() map[string]int
}

// checkMediaTokens refuses a body any of whose strings (or object keys), at any depth of any
// field, holds one of media, and token-id prompts that hold one of their ids. A field's bytes
// are decoded only when they could spell one: the token itself, or a JSON escape (\u, \/) that
// could hide it.
func (r *Request) checkMediaTokens(media map[string]int) *apierr.Error {
	if len(media) == 0 {
		return nil
	}
	tokens := make([]string, 0, len(media))
	for tok := range media {
		tokens = append(tokens, tok)
	}
	sort.Strings(tokens)
	keys := make([]string, 0, len(r.Fields))
	for k := range r.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		raw := r.Fields[k]
		if !maySpell(raw, tokens) {
			continue
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			continue // the route's reader refused what it reads; nothing else is rendered
		}
		if path, tok := spelled(k, v, tokens); path != "" {
			return mediaError(path, tok)
		}
	}
	for i, p := range r.Prompts {
		for _, tok := range tokens {
			if !slices.Contains(p.Tokens, media[tok]) {
				continue
			}
			name := r.idsField
			if r.Batch {
				name = fmt.Sprintf("%s[%d]", name, i)
			}
			return mediaError(name, tok)
		}
	}
	return nil
}

func mediaError(field, tok string) *apierr.Error {
	return apierr.BadRequest(field, fmt.Sprintf("The text holds %q, one of the model's media placeholder tokens: the engine would expand it into media the request does not carry. Send images as image parts, and leave the model's special tokens out of text.", tok))
}

// maySpell says raw (a field's JSON) could decode to a string holding one of tokens.
func maySpell(raw []byte, tokens []string) bool {
	if bytes.Contains(raw, []byte(`\u`)) || bytes.Contains(raw, []byte(`\/`)) {
		return true
	}
	for _, t := range tokens {
		if bytes.Contains(raw, []byte(t)) {
			return true
		}
	}
	return false
}

// spelled finds the first string or key under v (at path) holding one of tokens: its path and
// the token, or "".
func spelled(path string, v any, tokens []string) (string, string) {
	holds := func(s string) string {
		for _, t := range tokens {
			if strings.Contains(s, t) {
				return t
			}
		}
		return ""
	}
	switch x := v.(type) {
	case string:
		if t := holds(x); t != "" {
			return path, t
		}
	case []any:
		for i, e := range x {
			if p, t := spelled(fmt.Sprintf("%s[%d]", path, i), e, tokens); p != "" {
				return p, t
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if t := holds(k); t != "" {
				return path + "." + k, t
			}
			if p, t := spelled(path+"."+k, x[k], tokens); p != "" {
				return p, t
			}
		}
	}
	return "", ""
}
