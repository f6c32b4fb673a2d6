package kvmodel

import (
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"

	"github.com/kvgate/kvgate/tokenize/hf"
)

// Tokenizer turns text into tokens. Every token keeps its text because the
// simulated model quotes text out of the pool, not ids.
//
// Special-token text such as "<|im_start|>" is tokenized as ordinary text by
// both tokenizers, in generation and in /tokenize alike, so counts agree.
type Tokenizer interface {
	Name() string
	// Encode returns the ids and the text of each token; the texts
	// concatenate to the input.
	Encode(text string) ([]uint32, []string)
}

// NewTokenizer returns the tokenizer named cl100k, chunk4 or hf:DIR (a model's own tokenizer
// from DIR/tokenizer.json and DIR/tokenizer_config.json).
func NewTokenizer(name string) (Tokenizer, error) {
	if dir, ok := strings.CutPrefix(name, "hf:"); ok {
		t, err := hf.Load(dir)
		if err != nil {
			return nil, err
		}
		return &HFTokenizer{name: name, Dir: dir, T: t}, nil
	}
	switch name {
	case "cl100k", "cl100k_base":
		return cl100k()
	case "chunk4":
		return chunk4{}, nil
	}
	return nil, fmt.Errorf("unknown tokenizer %q (want cl100k, chunk4 or hf:DIR)", name)
}

var (
	cl100kOnce  sync.Once
	cl100kCodec tokenizer.Codec
	cl100kErr   error
)

// cl100k shares one codec per process: building it costs ~20 ms and 3 MB.
func cl100k() (Tokenizer, error) {
	cl100kOnce.Do(func() {
		cl100kCodec, cl100kErr = tokenizer.Get(tokenizer.Cl100kBase)
	})
	if cl100kErr != nil {
		return nil, cl100kErr
	}
	return cl100kTok{cl100kCodec}, nil
}

// Decoder is implemented by a tokenizer that can turn ids back into text
// (cl100k; chunk4's ids are hashes and cannot be inverted).
type Decoder interface {
	Decode(ids []uint32) (string, error)
}

type cl100kTok struct{ c tokenizer.Codec }

func (t cl100kTok) Decode(ids []uint32) (string, error) {
	u := make([]uint, len(ids))
	for i, id := range ids {
		u[i] = uint(id)
	}
	return t.c.Decode(u)
}

func (cl100kTok) Name() string { return "cl100k" }

func (t cl100kTok) Encode(text string) ([]uint32, []string) {
	ids, toks, err := t.c.Encode(text)
	if err != nil {
		// The default error mode never fails on text; fall back to bytes so a
		// count is still an upper bound rather than a crash.
		return byteTokens(text)
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out, toks
}

// HFTokenizer is a model's own tokenizer (tokenize/hf, the library kvgate counts with too):
// special-token text such as "<|im_start|>" is one token here, as in SGLang, and T renders the
// model's chat template.
type HFTokenizer struct {
	name string
	Dir  string // the model directory (its preprocessor_config.json gives the image rule)
	T    *hf.Tokenizer
}

func (t *HFTokenizer) Name() string { return t.name }

func (t *HFTokenizer) Encode(text string) ([]uint32, []string) { return t.T.Encode(text) }

func byteTokens(text string) ([]uint32, []string) {
	ids := make([]uint32, len(text))
	toks := make([]string, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = uint32(text[i])
		toks[i] = text[i : i+1]
	}
	return ids, toks
}

// chunk4 is deliberately unlike any real tokenizer: each space (U+0020) is a
// token, and each run of non-space bytes is cut into pieces of at most 4
// bytes without splitting a UTF-8 sequence (a single rune longer than 4 bytes
// cannot exist, so every piece is 1 to 4 bytes). Ids are a hash of the piece,
// so two processes agree on them without sharing a table.
type chunk4 struct{}

func (chunk4) Name() string { return "chunk4" }

func (chunk4) Encode(text string) ([]uint32, []string) {
	toks := make([]string, 0, len(text)/3+1)
	i := 0
	for i < len(text) {
		if text[i] == ' ' {
			toks = append(toks, text[i:i+1])
			i++
			continue
		}
		j := i
		for j < len(text) && text[j] != ' ' && j-i < 4 {
			_, n := utf8.DecodeRuneInString(text[j:])
			if j+n-i > 4 {
				break
			}
			j += n
		}
		toks = append(toks, text[i:j])
		i = j
	}
	ids := make([]uint32, len(toks))
	for k, s := range toks {
		ids[k] = chunk4ID(s)
	}
	return ids, toks
}

func chunk4ID(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32() & 0x7fffffff
}

// CachedTokenizer remembers the tokenization of short prompts: benchmark
// traffic repeats prompts, and cl100k's split regexp is most of a small
// request's CPU. The returned slices are shared and must not be modified.
type CachedTokenizer struct {
	Tokenizer
	mu sync.Mutex
	m  map[string]encoded
}

type encoded struct {
	ids   []uint32
	texts []string
}

const (
	cacheMaxPrompt  = 4096 // bytes; longer prompts are tokenized every time
	cacheMaxEntries = 4096 // the cache is dropped whole when full
)

// NewCachedTokenizer wraps t with the cache.
func NewCachedTokenizer(t Tokenizer) *CachedTokenizer {
	return &CachedTokenizer{Tokenizer: t, m: map[string]encoded{}}
}

// Encode is t's Encode, from the cache when the prompt is short and was seen.
func (c *CachedTokenizer) Encode(text string) ([]uint32, []string) {
	if len(text) > cacheMaxPrompt {
		return c.Tokenizer.Encode(text)
	}
	c.mu.Lock()
	e, ok := c.m[text]
	c.mu.Unlock()
	if ok {
		return e.ids, e.texts
	}
	ids, texts := c.Tokenizer.Encode(text)
	c.mu.Lock()
	if len(c.m) >= cacheMaxEntries {
		clear(c.m)
	}
	c.m[text] = encoded{ids, texts}
	c.mu.Unlock()
	return ids, texts
}
