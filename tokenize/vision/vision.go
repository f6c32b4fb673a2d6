// Package vision turns an image's size into the tokens a vision model's processor makes of it,
// by the rule its preprocessor_config.json names (image_processor_type): Qwen2-VL, Qwen2.5-VL
// and Qwen3-VL resize with smart_resize and emit one token per merged patch; Gemma 3 emits a
// fixed count per image; Llama 4 cuts the image into tiles of a fixed size plus one global
// view. A rule it does not know is not approximated: Load says so and images stay refused. It
// is a leaf library (the engine simulator charges images with it too) and reads no pixels.
package vision

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// File names inside a model directory.
const (
	PreprocessorFile = "preprocessor_config.json"
	ProcessorFile    = "processor_config.json"
)

// Family is a processor's way of counting.
type Family string

const (
	Qwen   Family = "qwen2-vl" // Qwen2-VL, Qwen2.5-VL, Qwen3-VL: smart_resize
	Gemma3 Family = "gemma3"   // a fixed count per image
	Llama4 Family = "llama4"   // tiles and a global view
)

// ErrNoRule: the directory has no preprocessor_config.json (a text-only model).
var ErrNoRule = errors.New("no " + PreprocessorFile)

// ErrUnsupported: the processor named has no rule here (images stay refused).
var ErrUnsupported = errors.New("no counting rule for this image processor")

// Rule is one model's image rule. Its zero value is not usable; build it with Load or Parse.
type Rule struct {
	Family Family
	// Qwen: smart_resize's factor (patch_size × merge_size) and pixel bounds.
	factor, minPixels, maxPixels int
	// Gemma 3: tokens per image (image_seq_length).
	perImage int
	// Llama 4: the tile side, the most tiles, and tokens per tile.
	tile, maxTiles, perTile int
	// minSide is the shortest side the processor takes (Tokens refuses shorter ones).
	minSide int
	// placeholder is what the chat template renders for an image part and the processor
	// replaces; rendered is how many tokens the template's own text for one image holds.
	placeholder  string
	rendered     int
	renderedText string
}

// Load reads dir's preprocessor_config.json (and, for Gemma 3 and Llama 4, processor_config.json
// when present). ErrNoRule when there is none.
func Load(dir string) (*Rule, error) {
	raw, err := os.ReadFile(filepath.Join(dir, PreprocessorFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoRule
	}
	if err != nil {
		return nil, err
	}
	proc, err := os.ReadFile(filepath.Join(dir, ProcessorFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return Parse(raw, proc)
}

type preprocessorJSON struct {
	Type string `json:"image_processor_type"`
	// Qwen
	PatchSize         *int `json:"patch_size"`
	MergeSize         *int `json:"merge_size"`
	TemporalPatchSize *int `json:"temporal_patch_size"`
	MinPixels         *int `json:"min_pixels"`
	MaxPixels         *int `json:"max_pixels"`
	Size              struct {
		ShortestEdge *int `json:"shortest_edge"`
		LongestEdge  *int `json:"longest_edge"`
		Height       *int `json:"height"`
		Width        *int `json:"width"`
	} `json:"size"`
	// Gemma 3
	ImageSeqLength *int  `json:"image_seq_length"`
	PanAndScan     *bool `json:"do_pan_and_scan"`
	// Llama 4
	MaxPatches        *int  `json:"max_patches"`
	ResizeToMaxCanvas *bool `json:"resize_to_max_canvas"`
}

type processorJSON struct {
	ImageSeqLength    *int     `json:"image_seq_length"`
	PatchSize         *int     `json:"patch_size"`
	PixelShuffleRatio *float64 `json:"pixel_shuffle_ratio"`
}

// positive reads an optional positive setting, def when absent.
func positive(name string, v *int, def int) (int, error) {
	if v == nil {
		return def, nil
	}
	if *v <= 0 || *v > 1<<30 {
		return 0, fmt.Errorf("%s %s: %d is not a positive size", PreprocessorFile, name, *v)
	}
	return *v, nil
}

// Parse builds a rule from the contents of preprocessor_config.json and processor_config.json
// (nil when absent).
func Parse(pre, proc []byte) (*Rule, error) {
	var c preprocessorJSON
	if err := json.Unmarshal(pre, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", PreprocessorFile, err)
	}
	var p processorJSON
	if len(proc) > 0 {
		if err := json.Unmarshal(proc, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", ProcessorFile, err)
		}
	}
	typ := strings.TrimSuffix(c.Type, "Fast")
	switch typ {
	case "Qwen2VLImageProcessor", "Qwen2_5_VLImageProcessor", "Qwen3VLImageProcessor":
		return parseQwen(c)
	case "Gemma3ImageProcessor":
		return parseGemma3(c, p)
	case "Llama4ImageProcessor":
		return parseLlama4(c, p)
	}
	return nil, fmt.Errorf("%s: image_processor_type %q: %w (supported: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, Llama 4)", PreprocessorFile, c.Type, ErrUnsupported)
}

// parseQwen: transformers' Qwen2VLImageProcessor defaults (patch 14, merge 2, min_pixels 56²,
// max_pixels 28²×1280); min_pixels/max_pixels win over size.shortest_edge/longest_edge, as the
// processor's constructor applies them ("backward compatibility: override size with
// min_pixels and max_pixels if they are provided").
func parseQwen(c preprocessorJSON) (*Rule, error) {
	patch, err := positive("patch_size", c.PatchSize, 14)
	if err != nil {
		return nil, err
	}
	merge, err := positive("merge_size", c.MergeSize, 2)
	if err != nil {
		return nil, err
	}
	minP, err := positive("size.shortest_edge", c.Size.ShortestEdge, 56*56)
	if err != nil {
		return nil, err
	}
	maxP, err := positive("size.longest_edge", c.Size.LongestEdge, 28*28*1280)
	if err != nil {
		return nil, err
	}
	if minP, err = positive("min_pixels", c.MinPixels, minP); err != nil {
		return nil, err
	}
	if maxP, err = positive("max_pixels", c.MaxPixels, maxP); err != nil {
		return nil, err
	}
	f := patch * merge
	if minP > maxP || maxP < f*f || f > 1<<12 {
		return nil, fmt.Errorf("%s: min_pixels %d, max_pixels %d and factor %d admit no image size", PreprocessorFile, minP, maxP, f)
	}
	// The template renders <|vision_start|><|image_pad|><|vision_end|> per image; the
	// processor repeats <|image_pad|> once per merged patch.
	return &Rule{Family: Qwen, factor: f, minPixels: minP, maxPixels: maxP, minSide: f, placeholder: "<|image_pad|>", rendered: 3,
		renderedText: "<|vision_start|><|image_pad|><|vision_end|>"}, nil
}

// parseGemma3: image_seq_length (256) soft tokens per image; pan and scan (extra crops per
// image) is not modelled, so a configuration that turns it on is refused.
func parseGemma3(c preprocessorJSON, p processorJSON) (*Rule, error) {
	if c.PanAndScan != nil && *c.PanAndScan {
		return nil, fmt.Errorf("%s: do_pan_and_scan adds crops per image, which this gateway does not count", PreprocessorFile)
	}
	n := c.ImageSeqLength
	if p.ImageSeqLength != nil {
		n = p.ImageSeqLength
	}
	per, err := positive("image_seq_length", n, 256)
	if err != nil {
		return nil, err
	}
	// The template renders <start_of_image>; Gemma3Processor replaces it with
	// "\n\n<start_of_image>" + per × <image_soft_token> + "<end_of_image>\n\n".
	return &Rule{Family: Gemma3, perImage: per, minSide: patchSide, placeholder: "<start_of_image>", rendered: 1, renderedText: "<start_of_image>"}, nil
}

// parseLlama4: tiles of size.height (336) pixels, at most max_patches (16) of them; each tile
// (and the global view) is (tile/patch_size)² patches merged by pixel_shuffle_ratio² (14 and 0.5
// in Llama4Processor's defaults: 144 tokens).
func parseLlama4(c preprocessorJSON, p processorJSON) (*Rule, error) {
	tile, err := positive("size.height", c.Size.Height, 336)
	if err != nil {
		return nil, err
	}
	if w, err := positive("size.width", c.Size.Width, tile); err != nil || w != tile {
		return nil, fmt.Errorf("%s: size must be square", PreprocessorFile)
	}
	maxTiles, err := positive("max_patches", c.MaxPatches, 16)
	if err != nil {
		return nil, err
	}
	if c.ResizeToMaxCanvas != nil && *c.ResizeToMaxCanvas {
		return nil, fmt.Errorf("%s: resize_to_max_canvas is not counted by this gateway", PreprocessorFile)
	}
	patch, err := positive("patch_size", p.PatchSize, 14)
	if err != nil {
		return nil, err
	}
	ratio := 0.5
	if p.PixelShuffleRatio != nil {
		ratio = *p.PixelShuffleRatio
	}
	if !(ratio > 0 && ratio <= 1) || maxTiles > 1024 || tile < patch {
		return nil, fmt.Errorf("%s/%s: tile %d, patch %d, pixel_shuffle_ratio %v, max_patches %d admit no image", PreprocessorFile, ProcessorFile, tile, patch, ratio, maxTiles)
	}
	// Llama4Processor: num_patches_per_chunk = (tile // patch)² // round(1 / ratio²).
	down := int(math.Round(1 / (ratio * ratio)))
	per := (tile / patch) * (tile / patch) / down
	if per <= 0 {
		return nil, fmt.Errorf("%s: %d tokens per tile", ProcessorFile, per)
	}
	return &Rule{Family: Llama4, tile: tile, maxTiles: maxTiles, perTile: per, minSide: max(patch, patchSide), placeholder: "<|image|>", rendered: 1, renderedText: "<|image|>"}, nil
}

// Placeholder is the token the chat template renders for each image part and the processor
// replaces with the image's tokens.
func (r *Rule) Placeholder() string { return r.placeholder }

// Rendered is the text the template renders for one image part and how many tokens it holds
// (Qwen: <|vision_start|><|image_pad|><|vision_end|>, 3), which Count.Total includes.
func (r *Rule) Rendered() (string, int) { return r.renderedText, r.rendered }

// Count is what one image becomes.
type Count struct {
	// Image is the tokens the vision encoder's output fills (Qwen: one per merged patch, the
	// value of (grid_h × grid_w) / merge_size² that the processor computes).
	Image int
	// Total is every token the image takes in the prompt: Image plus the special tokens around
	// it (the template's and the processor's).
	Total int
}

// ErrImage is wrapped by every refusal of an image's size.
var ErrImage = errors.New("image")

// patchSide is the vision encoder's patch side of Gemma 3 (SigLIP) and Llama 4 (14 pixels): the
// shortest side they are taken at.
const patchSide = 14

// MinSide is the shortest side an image may have: Qwen's factor (patch × merge, transformers'
// smart_resize "height:… or width:… must be larger than factor"), Gemma 3's and Llama 4's patch.
// Below it processors refuse the image or break on it: a side of 1 or 3 pixels makes the
// channel axis of an (h, w, 3) array ambiguous to transformers' infer_channel_dimension_format,
// which then takes the height for the channels (vllm#8954: a 1×1 image stopped the engine;
// CVE-2026-22773). SGLang's own Qwen resize would enlarge such an image; it is refused anyway,
// as the processors' own rule: a client can enlarge it.
func (r *Rule) MinSide() int { return r.minSide }

// Tokens is what an image of width × height pixels becomes.
func (r *Rule) Tokens(width, height int) (Count, error) {
	if width <= 0 || height <= 0 {
		return Count{}, fmt.Errorf("%w: %d×%d pixels", ErrImage, width, height)
	}
	if min(width, height) < r.minSide {
		return Count{}, fmt.Errorf("%w: %d×%d pixels, under the processor's smallest side of %d pixels (send it enlarged)", ErrImage, width, height, r.minSide)
	}
	switch r.Family {
	case Qwen:
		h, w, err := SmartResize(height, width, r.factor, r.minPixels, r.maxPixels)
		if err != nil {
			return Count{}, err
		}
		n := (h / r.factor) * (w / r.factor)
		return Count{Image: n, Total: n + 2}, nil
	case Gemma3:
		// "\n\n" twice (one token each in Gemma's vocabulary, or fewer where they merge with
		// the text around), <start_of_image>, the soft tokens, <end_of_image>.
		return Count{Image: r.perImage, Total: r.perImage + 4}, nil
	case Llama4:
		th, tw := r.tiles(height, width)
		return Count{Image: r.llama4Image(th, tw), Total: r.llama4Total(th, tw)}, nil
	}
	return Count{}, fmt.Errorf("%w: no rule", ErrImage)
}

// Max is the most tokens any image can become (a remote image is counted so, unseen).
func (r *Rule) Max() Count {
	switch r.Family {
	case Qwen:
		// smart_resize keeps h·w ≤ max_pixels when it rounds or shrinks (its shrinking branch
		// floors both sides); when it enlarges to min_pixels the ceilings add at most one factor
		// per side: h·w < min + f·√min·(√200 + 1/√200) + f² for aspect ratios up to 200.
		f := float64(r.factor)
		grow := (float64(r.minPixels) + f*math.Sqrt(float64(r.minPixels))*(math.Sqrt(200)+1/math.Sqrt(200)) + f*f) / (f * f)
		n := max(r.maxPixels/(r.factor*r.factor), int(math.Ceil(grow)))
		return Count{Image: n, Total: n + 2}
	case Gemma3:
		return Count{Image: r.perImage, Total: r.perImage + 4}
	case Llama4:
		best := Count{}
		for th := 1; th <= r.maxTiles; th++ {
			for tw := 1; th*tw <= r.maxTiles; tw++ {
				if t := r.llama4Total(th, tw); t > best.Total {
					best = Count{Image: r.llama4Image(th, tw), Total: t}
				}
			}
		}
		return best
	}
	return Count{}
}

// Expansion is the text the processor puts in place of the template's placeholder for an
// image of width × height pixels (what an engine tokenizes; the simulator uses it).
func (r *Rule) Expansion(width, height int) (string, error) {
	c, err := r.Tokens(width, height)
	if err != nil {
		return "", err
	}
	switch r.Family {
	case Qwen:
		return strings.Repeat("<|image_pad|>", c.Image), nil
	case Gemma3:
		return "\n\n<start_of_image>" + strings.Repeat("<image_soft_token>", c.Image) + "<end_of_image>\n\n", nil
	case Llama4:
		th, tw := r.tiles(height, width)
		return r.llama4Prompt(th, tw), nil
	}
	return "", fmt.Errorf("%w: no rule", ErrImage)
}

// SmartResize is transformers' smart_resize (models/qwen2_vl/image_processing_qwen2_vl.py):
//
//	if max(height, width) / min(height, width) > 200: raise ValueError
//	h_bar = round(height / factor) * factor
//	w_bar = round(width / factor) * factor
//	if h_bar * w_bar > max_pixels:
//	    beta = math.sqrt((height * width) / max_pixels)
//	    h_bar = max(factor, math.floor(height / beta / factor) * factor)
//	    w_bar = max(factor, math.floor(width / beta / factor) * factor)
//	elif h_bar * w_bar < min_pixels:
//	    beta = math.sqrt(min_pixels / (height * width))
//	    h_bar = math.ceil(height * beta / factor) * factor
//	    w_bar = math.ceil(width * beta / factor) * factor
//	return h_bar, w_bar
//
// Python's round is round-half-to-even, and its divisions are float64 as here. Sides below the
// factor get one factor (SGLang's own smart_resize, run first: max(factor, round(...)));
// transformers refuses them, and so does Rule.Tokens (MinSide).
func SmartResize(height, width, factor, minPixels, maxPixels int) (int, int, error) {
	if max(height, width) > 200*min(height, width) {
		return 0, 0, fmt.Errorf("%w: aspect ratio %d×%d is over 200 (the processor refuses it)", ErrImage, width, height)
	}
	f := float64(factor)
	h := max(factor, int(math.RoundToEven(float64(height)/f))*factor)
	w := max(factor, int(math.RoundToEven(float64(width)/f))*factor)
	if h*w > maxPixels {
		beta := math.Sqrt(float64(height) * float64(width) / float64(maxPixels))
		h = max(factor, int(math.Floor(float64(height)/beta/f))*factor)
		w = max(factor, int(math.Floor(float64(width)/beta/f))*factor)
	} else if h*w < minPixels {
		beta := math.Sqrt(float64(minPixels) / (float64(height) * float64(width)))
		h = int(math.Ceil(float64(height)*beta/f)) * factor
		w = int(math.Ceil(float64(width)*beta/f)) * factor
	}
	return h, w, nil
}

// tiles is Llama 4's canvas in tiles (rows, columns): transformers' get_best_fit over
// find_supported_resolutions(max_patches, tile) (models/llama4/image_processing_llama4_fast.py):
// every layout of at most max_patches tiles; per layout the scale min(canvas_h / h,
// canvas_w / w); the smallest scale ≥ 1 if any (upscaling as little as possible), else the
// largest below 1; among layouts with that scale the smallest area. Scales are float32, as the
// torch tensors that compute them.
func (r *Rule) tiles(height, width int) (int, int) {
	scale := func(th, tw int) float32 {
		sh := float32(th*r.tile) / float32(height)
		sw := float32(tw*r.tile) / float32(width)
		return min(sh, sw)
	}
	var up, down float32 = -1, -1
	for th := 1; th <= r.maxTiles; th++ {
		for tw := 1; th*tw <= r.maxTiles; tw++ {
			s := scale(th, tw)
			if s >= 1 && (up < 0 || s < up) {
				up = s
			}
			if s < 1 && s > down {
				down = s
			}
		}
	}
	pick := up
	if pick < 0 {
		pick = down
	}
	bh, bw := 0, 0
	for th := 1; th <= r.maxTiles; th++ {
		for tw := 1; th*tw <= r.maxTiles; tw++ {
			if scale(th, tw) == pick && (bh == 0 || th*tw < bh*bw) {
				bh, bw = th, tw
			}
		}
	}
	return bh, bw
}

// llama4Image is the patch tokens of an image cut into th × tw tiles: every tile's and the
// global view's (a single tile has only the global view).
func (r *Rule) llama4Image(th, tw int) int {
	if th*tw > 1 {
		return (th*tw + 1) * r.perTile
	}
	return r.perTile
}

// llama4Total counts Llama4Processor._prompt_split_image's text: <|image_start|>, then for
// more than one tile each row's tiles of <|patch|>s separated by <|tile_x_separator|> and
// ended by <|tile_y_separator|>, then <|image|>, the global view's <|patch|>s, <|image_end|>.
func (r *Rule) llama4Total(th, tw int) int {
	n := r.llama4Image(th, tw) + 3
	if th*tw > 1 {
		n += th * tw // tw−1 x separators and one y separator per row
	}
	return n
}

func (r *Rule) llama4Prompt(th, tw int) string {
	var b strings.Builder
	patches := strings.Repeat("<|patch|>", r.perTile)
	b.WriteString("<|image_start|>")
	if th*tw > 1 {
		for y := 0; y < th; y++ {
			for x := 0; x < tw; x++ {
				b.WriteString(patches)
				if x < tw-1 {
					b.WriteString("<|tile_x_separator|>")
				}
			}
			b.WriteString("<|tile_y_separator|>")
		}
	}
	b.WriteString("<|image|>")
	b.WriteString(patches)
	b.WriteString("<|image_end|>")
	return b.String()
}
