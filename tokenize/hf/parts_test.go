package hf_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tokenize/hf"
)

// A template that loops over a message's content takes parts (SGLang's "openai" content
// format); Qwen2.5-VL's renders each {"type": "image"} part as
// <|vision_start|><|image_pad|><|vision_end|>, and the rendering and its count equal Hugging
// Face's own Jinja and tokenizer given the same parts. Qwen3's, Llama 3's and DeepSeek V3's
// templates take strings.
func TestImagePartsRenderLikeHuggingFace(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3", "deepseek_v3"} {
		if mustLoad(t, model).RendersParts() {
			t.Errorf("%s: its template was read as taking content parts", model)
		}
	}
	dir := hfref.QwenVLDir(t)
	tk, err := hf.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !tk.RendersParts() {
		t.Fatal("Qwen2.5-VL's template loops over content, but was not read as taking parts")
	}
	var chats []hfref.Chat
	for _, msgs := range []string{
		`[{"role":"user","content":[{"type":"image"},{"type":"text","text":"What is this?"}]}]`,
		`[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Compare "},{"type":"image"},{"type":"text","text":" with "},{"type":"image"}]}]`,
		`[{"role":"user","content":[{"type":"image"}]},{"role":"assistant","content":"A cat."},{"role":"user","content":[{"type":"text","text":"\n\nKVG-abcdefghijklmnopqrst\n\n"},{"type":"image"},{"type":"image"},{"type":"image"}]}]`,
	} {
		chats = append(chats, hfref.Chat{Messages: json.RawMessage(msgs), AddGenerationPrompt: true})
	}
	ref := hfref.ReferenceDir(t, dir, nil, chats)
	for i, c := range chats {
		text, err := tk.Render(c.Messages, nil, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		var want string
		if json.Unmarshal(ref.Renders[i], &want) != nil || text != want {
			t.Errorf("chat %d: rendered %q, Hugging Face %s", i, text, ref.Renders[i])
		}
		if got, want := strings.Count(text, "<|vision_start|><|image_pad|><|vision_end|>"), strings.Count(string(c.Messages), `"type":"image"`); got != want {
			t.Errorf("chat %d: %d image placeholders for %d image parts", i, got, want)
		}
		if n, _ := tk.Count(text, -1); n != ref.RenderCounts[i] {
			t.Errorf("chat %d: %d tokens, Hugging Face %d", i, n, ref.RenderCounts[i])
		}
	}
}
