package request

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tokenize/hf"
)

// Text that spells the model's media placeholder tokens, read from its tokenizer's added
// tokens (Qwen3's: <|vision_start|>, <|vision_end|>, <|vision_pad|>, <|image_pad|>,
// <|video_pad|>), is a 400 naming the field, on every route and at any depth, escaped or not;
// token ids that hold one likewise; the model's other special tokens and image parts pass.
func TestMediaPlaceholderTokensRefused(t *testing.T) {
	tok, err := hf.Load(hfref.ModelDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	media := tok.MediaTokens()
	for _, want := range []string{"<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"} {
		if _, ok := media[want]; !ok {
			t.Fatalf("media tokens %v lack %s", media, want)
		}
	}
	if len(media) != 5 {
		t.Errorf("media tokens %v: want Qwen3's five", media)
	}
	pic := dataURL(t, "png", 100, 100)
	refused := []struct {
		kind        Kind
		body, param string
	}{
		{Chat, `{"messages":[{"role":"user","content":"look <|image_pad|> here"}]}`, "messages[0].content"},
		{Chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"` + pic + `"}},{"type":"text","text":"<|vision_start|><|image_pad|><|vision_end|>"}]}]}`, "messages[0].content[2].text"},
		{Chat, `{"messages":[{"role":"user","content":"escaped \u003c|video_pad|\u003e"}]}`, "messages[0].content"},
		{Chat, `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","description":"x <|vision_end|>","parameters":{"type":"object"}}}]}`, "tools[0].function.description"},
		{Chat, `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"<|image_pad|>":{"type":"string"}}}}}]}`, "tools[0].function.parameters.properties.<|image_pad|>"},
		{Responses, `{"input":"hi","instructions":"<|image_pad|>"}`, "instructions"},
		{Responses, `{"input":[{"role":"user","content":[{"type":"input_text","text":"<|video_pad|>"}]}]}`, "input[0].content[0].text"},
		{Messages, `{"max_tokens":5,"system":"<|vision_start|>","messages":[{"role":"user","content":"hi"}]}`, "system"},
		{Messages, `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"<|image_pad|>"}]}]}`, "messages[0].content[0].text"},
		{Completions, `{"prompt":"<|image_pad|>"}`, "prompt"},
		{Completions, `{"prompt":[1, 2, 151655]}`, "prompt"},
		{Completions, `{"prompt":[[1], [2, 151652]]}`, "prompt[1]"},
		{Generate, `{"text":"a <|video_pad|>"}`, "text"},
		{Generate, `{"input_ids":[151656]}`, "input_ids"},
	}
	for i, c := range refused {
		r, e := Parse(c.kind, []byte(c.body))
		if e != nil {
			t.Fatalf("case %d: parse: %+v", i, e)
		}
		r.Render()
		e = r.RenderTemplate(tok)
		if e == nil || e.Status != 400 || e.Param != c.param || !strings.Contains(e.Message, "media placeholder") {
			t.Errorf("case %d (%s): %+v, want 400 naming %s", i, c.body[:min(60, len(c.body))], e, c.param)
		}
	}
	passed := []struct {
		kind Kind
		body string
	}{
		{Chat, `{"messages":[{"role":"system","content":"<|im_start|> and image_pad and <|endoftext|> \u00e9"},{"role":"user","content":[{"type":"text","text":"what?"},{"type":"image_url","image_url":{"url":"` + pic + `"}}]}]}`},
		{Completions, `{"prompt":[1, 2, 151651, 151657]}`},
		{Generate, `{"text":"<|vision|> is not a token"}`},
		{Messages, `{"max_tokens":5,"messages":[{"role":"user","content":"plain \/ text"}]}`},
	}
	for i, c := range passed {
		r, e := Parse(c.kind, []byte(c.body))
		if e != nil {
			t.Fatalf("pass %d: parse: %+v", i, e)
		}
		r.Render()
		if e := r.RenderTemplate(tok); e != nil {
			t.Errorf("pass %d: %+v", i, e)
		}
	}
}
