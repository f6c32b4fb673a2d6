package hf

import "testing"

// The media placeholder tokens of the vision models' vocabularies are found by name; the chat
// and tool tokens around them are not (TestTextModelsHaveNoMediaTokens: nor any added token of
// the text-only Llama 3 and DeepSeek V3 tokenizers).
func TestMediaTokens(t *testing.T) {
	added := map[string]uint32{}
	media := []string{"<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|audio_bos|>", "<start_of_image>",
		"<image_soft_token>", "<end_of_image>", "<|image|>", "<|patch|>", "<|tile_x_separator|>", "<img>", "</img>",
		"<IMG_CONTEXT>", "[IMG_BREAK]", "<|media_pad|>", "<slice>"}
	other := []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<|box_start|>", "<|object_ref_start|>",
		"<think>", "<|eot_id|>", "<start_of_turn>", "<|fim_middle|>", "<|python_tag|>"}
	for i, s := range append(append([]string{}, media...), other...) {
		added[s] = uint32(1000 + i)
	}
	got := mediaTokens(added)
	for _, s := range media {
		if _, ok := got[s]; !ok {
			t.Errorf("%s not found", s)
		}
	}
	if len(got) != len(media) {
		t.Errorf("found %d, want %d: %v", len(got), len(media), got)
	}
}
