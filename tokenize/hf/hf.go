// Package hf loads a Hugging Face tokenizer directory (tokenizer.json and tokenizer_config.json,
// as shipped with a model) and counts prompts the way an engine serving that model does: the
// chat_template rendered with a Jinja engine, then the text tokenized by the model's own
// byte-level BPE (normalizer, pre-tokenizer pattern, added tokens, merges).
//
// Only what is known to count exactly is accepted: byte-level BPE with an NFC normalizer or none,
// Split pre-tokenizers whose patterns tokenize/bpe implements (the cl100k_base / Llama 3 and the
// Qwen2/Qwen3 families, DeepSeek V3's sequence of three) followed by ByteLevel, and added tokens
// without lstrip/rstrip/single_word.
// Anything else is refused with an error naming what is unsupported, never approximated.
package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"
	"golang.org/x/text/unicode/norm"

	"github.com/kvgate/kvgate/tokenize/bpe"
)

// File names inside a tokenizer directory.
const (
	TokenizerFile = "tokenizer.json"
	ConfigFile    = "tokenizer_config.json"
)

// Tokenizer is one model's tokenizer and chat template. Safe for concurrent use.
type Tokenizer struct {
	*bpe.Counter
	template *jinja.Template
	// BOS and EOS are the strings templates receive as bos_token / eos_token ("" when unset).
	BOS, EOS string
	// vars are the names the chat template reads and does not define (TemplateVariables).
	vars []string
	// EncodeAdds is how many special tokens the post-processor adds when text is encoded with
	// add_special_tokens (what an engine does with a /generate or completions text prompt; a
	// rendered chat template is encoded without them).
	EncodeAdds int
	// parts: the template loops over a message's content, so engines hand it content as a list
	// of parts (RendersParts).
	parts bool
	// media are the added tokens that stand for media (MediaTokens).
	media map[string]int
}

// contentLoop finds a template's loop over a message's content ({% for c in message['content'] %}
// or message.content): SGLang's (and vLLM's) detect_jinja_template_content_format reads such a
// template as the "openai" content format and hands it content parts as a list (images as
// {"type": "image"}); every other template gets the text parts joined with a space.
var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+\w+\s*(\.\s*content\b|\[\s*['"]content['"]\s*\])`)

// RendersParts says the chat template takes a message's content as a list of parts (the engine's
// "openai" content format), which is how it renders an image's placeholder.
func (t *Tokenizer) RendersParts() bool { return t.parts }

type tokenizerJSON struct {
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         struct {
		Type                    string            `json:"type"`
		Dropout                 *float64          `json:"dropout"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		FuseUnk                 bool              `json:"fuse_unk"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Vocab                   map[string]int    `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
	} `json:"model"`
}

type preTokenizerJSON struct {
	Type          string             `json:"type"`
	Pretokenizers []preTokenizerJSON `json:"pretokenizers"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       bool   `json:"use_regex"`
}

// Load reads dir/tokenizer.json and dir/tokenizer_config.json.
func Load(dir string) (*Tokenizer, error) {
	raw, err := os.ReadFile(filepath.Join(dir, TokenizerFile))
	if err != nil {
		return nil, err
	}
	cfgRaw, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, err
	}
	name := filepath.Base(filepath.Clean(dir))
	t, err := parse(name, raw, cfgRaw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return t, nil
}

func parse(name string, raw, cfgRaw []byte) (*Tokenizer, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(raw, &tj); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	m := tj.Model
	switch {
	case m.Type != "BPE":
		return nil, fmt.Errorf("%s: unsupported model type %q (only byte-level BPE)", TokenizerFile, m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, fmt.Errorf("%s: unsupported BPE dropout", TokenizerFile)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "",
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("%s: unsupported subword prefix or word suffix", TokenizerFile)
	case m.ByteFallback:
		return nil, fmt.Errorf("%s: unsupported byte_fallback (not a byte-level BPE)", TokenizerFile)
	}
	normalize, err := normalizer(tj.Normalizer)
	if err != nil {
		return nil, err
	}
	split, err := preTokenizer(tj.PreTokenizer)
	if err != nil {
		return nil, err
	}
	addedContent := map[string]bool{}
	for _, a := range tj.AddedTokens {
		addedContent[a.Content] = true
	}
	tokens, err := byteTokens(m.Vocab, addedContent)
	if err != nil {
		return nil, err
	}
	merges, err := parseMerges(m.Merges, m.Vocab)
	if err != nil {
		return nil, err
	}
	vocab, err := bpe.FromMerges(tokens, merges, m.IgnoreMerges)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	added := map[string]uint32{}
	for _, a := range tj.AddedTokens {
		if a.LStrip || a.RStrip || a.SingleWord {
			return nil, fmt.Errorf("%s: added token %q: lstrip, rstrip and single_word are unsupported", TokenizerFile, a.Content)
		}
		if a.Normalized && normalize != nil && normalize(a.Content) != a.Content {
			return nil, fmt.Errorf("%s: added token %q changes under the normalizer (unsupported)", TokenizerFile, a.Content)
		}
		added[a.Content] = uint32(a.ID)
	}
	adds, err := postProcessorAdds(tj.PostProcessor)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{Counter: bpe.NewCounter("hf/"+name, split, vocab, bpe.NewSpecialMatcher(added), normalize), EncodeAdds: adds,
		media: mediaTokens(added)}
	if err := t.loadConfig(cfgRaw); err != nil {
		return nil, err
	}
	return t, nil
}

// postProcessorAdds counts the special tokens a post-processor adds to one sequence.
func postProcessorAdds(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var p struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []map[string]any  `json:"single"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return 0, fmt.Errorf("%s: post_processor: %w", TokenizerFile, err)
	}
	switch p.Type {
	case "ByteLevel":
		return 0, nil
	case "TemplateProcessing":
		n := 0
		for _, piece := range p.Single {
			if _, ok := piece["SpecialToken"]; ok {
				n++
			}
		}
		return n, nil
	case "Sequence":
		n := 0
		for _, sub := range p.Processors {
			k, err := postProcessorAdds(sub)
			if err != nil {
				return 0, err
			}
			n += k
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s: unsupported post_processor type %q", TokenizerFile, p.Type)
}

func normalizer(raw json.RawMessage) (func(string) string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("%s: normalizer: %w", TokenizerFile, err)
	}
	switch {
	case n.Type == "NFC":
		return nfc, nil
	case n.Type == "Sequence" && len(n.Normalizers) == 0:
		return nil, nil
	case n.Type == "Sequence" && len(n.Normalizers) == 1:
		return normalizer(n.Normalizers[0])
	}
	return nil, fmt.Errorf("%s: unsupported normalizer %s", TokenizerFile, raw)
}

// nfc is Unicode NFC, skipped when the text is already in NFC (almost always: a quick check).
func nfc(s string) string {
	if norm.NFC.IsNormalString(s) {
		return s
	}
	return norm.NFC.String(s)
}

func preTokenizer(raw json.RawMessage) (*bpe.Splitter, error) {
	var p preTokenizerJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("%s: pre_tokenizer: %w", TokenizerFile, err)
	}
	steps := []preTokenizerJSON{p}
	if p.Type == "Sequence" {
		steps = p.Pretokenizers
	}
	// One or more Split steps (each cutting the pieces of the one before), then ByteLevel.
	if len(steps) >= 2 && steps[len(steps)-1].Type == "ByteLevel" {
		b := steps[len(steps)-1]
		if b.AddPrefixSpace || b.UseRegex {
			return nil, fmt.Errorf("%s: unsupported ByteLevel pre-tokenizer options (add_prefix_space and use_regex must be false after a Split)", TokenizerFile)
		}
		var patterns []string
		for _, s := range steps[:len(steps)-1] {
			if s.Type != "Split" || s.Pattern.Regex == nil || s.Behavior != "Isolated" || s.Invert {
				return nil, fmt.Errorf("%s: unsupported pre-tokenizer step %q (want Split steps with a Regex pattern, behavior Isolated, invert false, then ByteLevel)", TokenizerFile, s.Type)
			}
			patterns = append(patterns, *s.Pattern.Regex)
		}
		sp, err := bpe.NewSequenceSplitter(patterns)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
		}
		return sp, nil
	}
	return nil, fmt.Errorf("%s: unsupported pre_tokenizer %.200s (supported: Split steps with known patterns, then ByteLevel)", TokenizerFile, raw)
}

// byteLevelDecode maps GPT-2's byte-level alphabet (each byte shown as a printable rune) back
// to bytes.
var byteLevelDecode = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			m[rune(b)] = byte(b)
		} else {
			m[rune(256+n)] = byte(b)
			n++
		}
	}
	return m
}()

func fromByteLevel(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := byteLevelDecode[r]
		if !ok {
			return nil, fmt.Errorf("token %q is not in the byte-level alphabet", s)
		}
		out = append(out, b)
	}
	return out, nil
}

// byteTokens decodes the vocabulary into bytes by id. An entry outside the byte-level alphabet is
// accepted only when it is an added token (DeepSeek V3 lists its special tokens in the vocabulary
// too): added tokens are cut out of the text before BPE, so BPE never produces those entries, and
// they are left out (nil).
func byteTokens(vocab map[string]int, added map[string]bool) ([][]byte, error) {
	maxID := -1
	for _, id := range vocab {
		if id < 0 || id > 1<<24 {
			return nil, fmt.Errorf("%s: vocabulary id %d out of range", TokenizerFile, id)
		}
		maxID = max(maxID, id)
	}
	tokens := make([][]byte, maxID+1)
	for s, id := range vocab {
		b, err := fromByteLevel(s)
		if err != nil && added[s] {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
		}
		if tokens[id] != nil {
			return nil, fmt.Errorf("%s: two tokens have id %d", TokenizerFile, id)
		}
		tokens[id] = b
	}
	return tokens, nil
}

// parseMerges accepts both forms tokenizer.json uses: "a b" strings and ["a", "b"] pairs.
func parseMerges(raw []json.RawMessage, vocab map[string]int) ([][2]uint32, error) {
	out := make([][2]uint32, 0, len(raw))
	for i, r := range raw {
		var a, b string
		var s string
		var pair []string
		switch {
		case json.Unmarshal(r, &s) == nil:
			var ok bool
			if a, b, ok = strings.Cut(s, " "); !ok {
				return nil, fmt.Errorf("%s: merge %d %q is not two tokens", TokenizerFile, i, s)
			}
		case json.Unmarshal(r, &pair) == nil && len(pair) == 2:
			a, b = pair[0], pair[1]
		default:
			return nil, fmt.Errorf("%s: merge %d is neither \"a b\" nor [a, b]", TokenizerFile, i)
		}
		ia, oka := vocab[a]
		ib, okb := vocab[b]
		if !oka || !okb {
			return nil, fmt.Errorf("%s: merge %d (%q, %q) names a token not in the vocabulary", TokenizerFile, i, a, b)
		}
		out = append(out, [2]uint32{uint32(ia), uint32(ib)})
	}
	return out, nil
}

// tokenString reads bos_token / eos_token: a string or {"content": …}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Content
}

func (t *Tokenizer) loadConfig(raw []byte) error {
	var cfg struct {
		ChatTemplate   json.RawMessage `json:"chat_template"`
		BOS            json.RawMessage `json:"bos_token"`
		EOS            json.RawMessage `json:"eos_token"`
		TokenizerClass string          `json:"tokenizer_class"`
		AddBOS         *bool           `json:"add_bos_token"`
		AddEOS         *bool           `json:"add_eos_token"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", ConfigFile, err)
	}
	t.BOS, t.EOS = tokenString(cfg.BOS), tokenString(cfg.EOS)
	// transformers' LlamaTokenizerFast (DeepSeek V3's class) replaces tokenizer.json's
	// post-processor with one that adds add_bos_token / add_eos_token (BOS by default): that is
	// what an engine loading the model with transformers encodes a text prompt with.
	if cfg.TokenizerClass == "LlamaTokenizerFast" {
		t.EncodeAdds = 0
		if cfg.AddBOS == nil || *cfg.AddBOS {
			t.EncodeAdds++
		}
		if cfg.AddEOS != nil && *cfg.AddEOS {
			t.EncodeAdds++
		}
	}
	var source string
	if err := json.Unmarshal(cfg.ChatTemplate, &source); err != nil {
		// A list of named templates: the one named "default" is what engines render.
		var named []struct{ Name, Template string }
		if json.Unmarshal(cfg.ChatTemplate, &named) != nil {
			return fmt.Errorf("%s: no chat_template", ConfigFile)
		}
		for _, n := range named {
			if n.Name == "default" {
				source = n.Template
			}
		}
	}
	if source == "" {
		return fmt.Errorf("%s: no chat_template", ConfigFile)
	}
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return fmt.Errorf("%s: chat_template: %w", ConfigFile, err)
	}
	t.template = tmpl
	t.parts = contentLoop.MatchString(source)
	t.vars = templateVariables(source)
	return nil
}

// ErrTemplate wraps errors the chat template raised while rendering (raise_exception, a missing
// field): the request, not the gateway, is at fault.
var ErrTemplate = errors.New("chat template")

// Render renders the chat template the way an engine does for a chat request: messages (the
// request's JSON array, as the client sent it), tools (JSON array, or nil), add_generation_prompt,
// the model's bos_token and eos_token, and kwargs (chat_template_kwargs, a JSON object or nil)
// as further variables. JSON objects keep their key order, so tool definitions rendered with
// tojson read as the client wrote them, as Python's and JavaScript's Jinja render them.
func (t *Tokenizer) Render(messages, tools json.RawMessage, addGenerationPrompt bool, kwargs json.RawMessage) (string, error) {
	data := map[string]jinja.Value{}
	if len(kwargs) > 0 && string(kwargs) != "null" {
		kw, err := jsonValue(kwargs)
		if err != nil || !kw.IsDict() {
			return "", fmt.Errorf("%w: chat_template_kwargs must be a JSON object", ErrTemplate)
		}
		d := kw.AsDict()
		for _, k := range d.Keys {
			data[k] = d.Data[k]
		}
	}
	msgs, err := jsonValue(messages)
	if err != nil || !msgs.IsList() {
		return "", fmt.Errorf("%w: messages must be a JSON array", ErrTemplate)
	}
	data["messages"] = msgs
	if len(tools) > 0 && string(tools) != "null" {
		tv, err := jsonValue(tools)
		if err != nil || !tv.IsList() {
			return "", fmt.Errorf("%w: tools must be a JSON array", ErrTemplate)
		}
		data["tools"] = tv
	}
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	data["bos_token"] = jinja.NewString(t.BOS)
	data["eos_token"] = jinja.NewString(t.EOS)
	out, err := t.template.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	}
	return out, nil
}

// jsonValue decodes JSON into Jinja values, objects as ordered dicts.
func jsonValue(raw []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, _ := kt.(string)
				val, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(key, val)
			}
			_, err = dec.Token()
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				val, err := decodeValue(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, val)
			}
			_, err = dec.Token()
			return jinja.NewList(items), err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", x)
	case string:
		return jinja.NewString(x), nil
	case bool:
		return jinja.NewBool(x), nil
	case nil:
		return jinja.None(), nil
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return jinja.NewInt(i), nil
		}
		f, err := x.Float64()
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewFloat(f), nil
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}
