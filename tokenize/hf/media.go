package hf

import "strings"

// mediaWords name what a media placeholder token stands for, as vision and audio models spell
// them: Qwen's <|vision_start|>, <|image_pad|>, <|video_pad|>, <|audio_bos|>; Gemma 3's
// <start_of_image>, <image_soft_token>; Llama 4's <|image|>, <|patch|>, <|tile_x_separator|>;
// InternVL's <img>, <IMG_CONTEXT>; Pixtral's [IMG_BREAK]; Kimi's <|media_pad|>; MiniCPM-V's
// <slice>. Matched case-insensitively inside an added token's content.
var mediaWords = []string{"image", "video", "vision", "audio", "img", "patch", "media", "slice", "tile_"}

// mediaTokens are the added tokens among added whose content names media (content → id).
func mediaTokens(added map[string]uint32) map[string]int {
	m := map[string]int{}
	for content, id := range added {
		lower := strings.ToLower(content)
		for _, w := range mediaWords {
			if strings.Contains(lower, w) {
				m[content] = int(id)
				break
			}
		}
	}
	return m
}

// MediaTokens are the model's media placeholder tokens (content → id): added tokens that an
// engine's multimodal processor expands or fills with an image's, video's or audio's features.
// Text that spells one makes the engine expect media the request does not carry
// (CVE-2026-44222); request.RenderTemplate refuses it. The map is shared: do not change it.
func (t *Tokenizer) MediaTokens() map[string]int { return t.media }
