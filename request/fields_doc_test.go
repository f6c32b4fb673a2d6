package request

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// fieldsDoc renders the field table as docs/fields.md has it.
func fieldsDoc() string {
	var b strings.Builder
	b.WriteString("# Request fields: the table admission works from\n\n")
	b.WriteString("Generated from `request/fields.go` (`KVGATE_UPDATE_DOCS=1 go test ./request -run TestFieldsDocIsCurrent`);\n")
	b.WriteString("`TestFieldsDocIsCurrent` fails when this file and the table differ.\n\n")
	b.WriteString("Every field a route's engine reads has a verdict: **modeled** (its effect on the rendered prompt\n")
	b.WriteString("is in the count), **inert** (it cannot change the prompt) or **refused** (`400` in the route's\n")
	b.WriteString("envelope, naming the field, before any engine is contacted). A field with no row is refused\n")
	b.WriteString("wherever it sits. Paths: `a.b` is key `b` of object `a` (of each object when `a` is an array),\n")
	b.WriteString("`[]` marks an array of objects, `[type=x]` the objects whose `type` is `x` (`[type=]`: none\n")
	b.WriteString("given). A row with no rows below it takes its value whole (a string, a number, or JSON such as a\n")
	b.WriteString("tool's schema). `chat_template_kwargs` also accepts the switches the served model's own template\n")
	b.WriteString("reads (`tokenizer.hf_dir`), never the refused names nor any `*_token` variable.\n\n")
	b.WriteString("Thinking budgets (`sampling_params.thinking_budget`, Anthropic's `thinking.budget_tokens`) cap\n")
	b.WriteString("tokens inside the requested output (`max_tokens`, `max_new_tokens`): they add nothing to the\n")
	b.WriteString("output admission reserves. vLLM's `thinking_token_budget` is refused: with it vLLM forces its\n")
	b.WriteString("reasoning-end string into another concurrent request's output (GHSA-fpch-3xrf-7q96). A template's own\n")
	b.WriteString("`chat_template_kwargs.thinking_budget` passes only where the served model's template reads it.\n")
	b.WriteString("Client request ids never reach an engine: `rid` is refused, and the engine gets the gateway's\n")
	b.WriteString("own id in `rid` and `X-Request-Id` while the client gets its `X-Request-Id` back.\n")
	for k := Kind(0); k < Kinds; k++ {
		fmt.Fprintf(&b, "\n## `%s`\n\n| field | verdict | why refused |\n|---|---|---|\n", k.Path())
		for _, r := range FieldVerdicts(k) {
			why := r.Reason
			if r.Policy != "" {
				why += " (allowed by `" + r.Policy + "`)"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.Path, r.Verdict, why)
		}
	}
	b.WriteString(imagesDoc)
	return b.String()
}

// imagesDoc is how the image parts of the rows above are counted and what text is refused for
// them (request/images.go, request/media.go, tokenize/imagesize, tokenize/vision).
const imagesDoc = `
## Images: the size counted, and where a rule is unsure

An image part (chat ` + "`image_url`" + `, Responses ` + "`input_image`" + `, Messages ` + "`image`" + `) is counted at
the size Pillow opens it at, the library engines' processors load images with
(` + "`tokenize/imagesize`" + `, each rule citing Pillow's source), then by the model's processor rule:

| format | size counted | Pillow |
|---|---|---|
| PNG, APNG | IHDR (CRC checked); an APNG's default image is its first frame, inside IHDR | ` + "`PngImagePlugin`" + `: ` + "`im_size`" + ` from IHDR; fcTL frames outside it are invalid |
| JPEG | the frame header reached by Pillow's marker walk (junk skipped, JPGn markers without length), up to the first scan; EXIF thumbnails are inside APP1, skipped | ` + "`JpegImagePlugin._open`" + ` |
| JPEG, two frame headers | **refused**: Pillow sizes by the last, libjpeg refuses the file | the same; libjpeg's duplicate-SOF error |
| WebP (VP8, VP8L, VP8X; animated) | the canvas | ` + "`WebPImagePlugin`" + `: libwebp's demuxer, which refuses frames off the canvas |
| GIF | the logical screen grown to cover the first frame (a 28×28 screen with a 1×1 frame at 3583,3583: 3584×3584) | ` + "`GifImagePlugin._seek(0)`" + ` |

Refused with ` + "`400`" + ` naming the part: more than 178,956,970 pixels (Pillow's decompression-bomb
limit), a side shorter than the processor takes (Qwen: ` + "`patch_size × merge_size`" + `, 28 for
Qwen2/2.5-VL, as transformers' ` + "`smart_resize`" + ` refuses it; Gemma 3, Llama 4: 14; 1- and 3-pixel
sides make processors take the height for the channel axis, which crashed engines:
vllm#8954, CVE-2026-22773; SGLang's own Qwen resize would enlarge such an image), an aspect
ratio over 200 (Qwen's ` + "`smart_resize`" + ` raises), a GIF with no frame before its trailer.

Where the rule is unsure, the larger is counted:

- **EXIF orientation.** Orientations 5–8 swap width and height for a processor that applies them
  (transformers' ` + "`load_image`" + `: ` + "`exif_transpose`" + `); SGLang does not (sglang#33464). Every image is
  counted as the larger of both turns, without reading its EXIF (PNG eXIf, WebP EXIF, XMP all
  covered). The Qwen, Gemma 3 and Llama 4 rules count both turns alike, so this costs nothing today.
- **GIF frames after the first.** Not counted: processors decode the first frame, and Pillow grows
  the size again only when a later frame is sought. A GIF whose first frame lies off its screen is
  counted at the grown size.
- **A remote image** (` + "`tokenizer.remote_images: count_max`" + `) is counted as the most any image makes.

## Text that spells the model's media placeholder tokens

With ` + "`tokenizer.hf_dir`" + `, the model's media placeholder tokens are its tokenizer's added tokens named
for media (image, video, vision, audio, img, patch, media, slice, tile_: Qwen's
` + "`<|vision_start|>`" + `, ` + "`<|vision_end|>`" + `, ` + "`<|vision_pad|>`" + `, ` + "`<|image_pad|>`" + `, ` + "`<|video_pad|>`" + `). Any string or key of
the body, at any depth of any field, that holds one, and any token-id prompt that holds one's id,
is refused with ` + "`400`" + ` naming its path (e.g. ` + "`messages[0].content[2].text`" + `, ` + "`prompt[1]`" + `): SGLang's
processors take one image per placeholder found in the prompt and the model fills placeholder
positions with image features, so a spelled placeholder is media the request does not carry
(CVE-2026-44222), and no count is right for it. The model's other special tokens are counted as
before. Without ` + "`tokenizer.hf_dir`" + ` the model's tokens are unknown and nothing is refused.
`

// TestFieldsDocIsCurrent: docs/fields.md is the field table as it is.
func TestFieldsDocIsCurrent(t *testing.T) {
	const path = "../docs/fields.md"
	want := fieldsDoc()
	if os.Getenv("KVGATE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not the field table: run KVGATE_UPDATE_DOCS=1 go test ./request -run TestFieldsDocIsCurrent", path)
	}
}
