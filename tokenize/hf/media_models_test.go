package hf_test

import (
	"testing"

	"github.com/kvgate/kvgate/tokenize/hf"
)

func TestTextModelsHaveNoMediaTokens(t *testing.T) {
	for _, model := range []string{"llama3", "deepseek_v3"} {
		tok, err := hf.Load(modelDir(t, model))
		if err != nil {
			t.Fatal(err)
		}
		if m := tok.MediaTokens(); len(m) != 0 {
			t.Errorf("%s: media tokens %v", model, m)
		}
	}
	tok, err := hf.Load(modelDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	if m := tok.MediaTokens(); len(m) != 5 || m["<|image_pad|>"] != 151655 {
		t.Errorf("qwen3: media tokens %v", m)
	}
}
