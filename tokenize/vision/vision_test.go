package vision

import (
	"errors"
	"strings"
	"testing"
)

// qwenCases are Hugging Face's own values: testdata/smart_resize_reference.py runs transformers'
// smart_resize (copied unchanged from models/qwen2_vl/image_processing_qwen2_vl.py) and the
// processor's token arithmetic, for Qwen2.5-VL's patch 14 and merge 2 with its shipped pixel
// bounds and with the 256·28² … 1280·28² bounds deployments often set.
var qwenCases = []struct{ w, h, minP, maxP, rw, rh, tokens int }{
	{28, 28, 3136, 12845056, 56, 56, 4},
	{28, 28, 200704, 1003520, 448, 448, 256},
	{42, 42, 3136, 12845056, 56, 56, 4}, // 1.5 rounds to 2
	{42, 42, 200704, 1003520, 448, 448, 256},
	{70, 70, 3136, 12845056, 56, 56, 4}, // 2.5 rounds to 2: Python rounds half to even
	{70, 70, 200704, 1003520, 448, 448, 256},
	{56, 84, 3136, 12845056, 56, 84, 6},
	{56, 84, 200704, 1003520, 392, 560, 280},
	{100, 100, 3136, 12845056, 112, 112, 16},
	{100, 100, 200704, 1003520, 448, 448, 256},
	{224, 224, 3136, 12845056, 224, 224, 64},
	{224, 224, 200704, 1003520, 448, 448, 256},
	{640, 480, 3136, 12845056, 644, 476, 391},
	{640, 480, 200704, 1003520, 644, 476, 391},
	{480, 640, 3136, 12845056, 476, 644, 391},
	{480, 640, 200704, 1003520, 476, 644, 391},
	{1024, 768, 3136, 12845056, 1036, 756, 999},
	{1024, 768, 200704, 1003520, 1036, 756, 999},
	{1920, 1080, 3136, 12845056, 1932, 1092, 2691},
	{1920, 1080, 200704, 1003520, 1316, 728, 1222},
	{1080, 1920, 3136, 12845056, 1092, 1932, 2691},
	{1080, 1920, 200704, 1003520, 728, 1316, 1222},
	{3840, 2160, 3136, 12845056, 3836, 2156, 10549},
	{3840, 2160, 200704, 1003520, 1316, 728, 1222},
	{4000, 3000, 3136, 12845056, 4004, 2996, 15301},
	{4000, 3000, 200704, 1003520, 1148, 840, 1230},
	{5000, 5000, 3136, 12845056, 3556, 3556, 16129},
	{5000, 5000, 200704, 1003520, 980, 980, 1225},
	{10000, 200, 3136, 12845056, 9996, 196, 2499},
	{10000, 200, 200704, 1003520, 7056, 140, 1260},
	{200, 10000, 3136, 12845056, 196, 9996, 2499},
	{200, 10000, 200704, 1003520, 140, 7056, 1260},
	{30, 5000, 3136, 12845056, 28, 5012, 179},
	{30, 5000, 200704, 1003520, 56, 5796, 414},
	{1234, 567, 3136, 12845056, 1232, 560, 880},
	{1234, 567, 200704, 1003520, 1232, 560, 880},
	{333, 777, 3136, 12845056, 336, 784, 336},
	{333, 777, 200704, 1003520, 336, 784, 336},
	{98, 126, 3136, 12845056, 112, 112, 16},
	{98, 126, 200704, 1003520, 420, 532, 285},
	{2048, 2048, 3136, 12845056, 2044, 2044, 5329},
	{2048, 2048, 200704, 1003520, 980, 980, 1225},
	{60, 60, 3136, 12845056, 56, 56, 4},
	{60, 60, 200704, 1003520, 448, 448, 256},
	{4096, 64, 3136, 12845056, 4088, 56, 292},
	{4096, 64, 200704, 1003520, 4088, 56, 292},
	{911, 1733, 3136, 12845056, 924, 1736, 2046},
	{911, 1733, 200704, 1003520, 700, 1372, 1225},
}

func TestQwen25VLCountsEqualHuggingFace(t *testing.T) {
	rule, err := Load("testdata/qwen2_5_vl")
	if err != nil {
		t.Fatal(err)
	}
	if rule.Family != Qwen || rule.factor != 28 || rule.minPixels != 3136 || rule.maxPixels != 12845056 {
		t.Fatalf("rule %+v", rule)
	}
	shapes := map[[2]int]bool{}
	for _, c := range qwenCases {
		rh, rw, err := SmartResize(c.h, c.w, 28, c.minP, c.maxP)
		if err != nil || rh != c.rh || rw != c.rw {
			t.Errorf("%d×%d [%d, %d]: smart_resize %d×%d (%v), Hugging Face %d×%d", c.w, c.h, c.minP, c.maxP, rw, rh, err, c.rw, c.rh)
		}
		if c.minP != rule.minPixels {
			continue
		}
		shapes[[2]int{c.w, c.h}] = true
		got, err := rule.Tokens(c.w, c.h)
		if err != nil || got.Image != c.tokens || got.Total != c.tokens+2 {
			t.Errorf("%d×%d: %+v (%v), Hugging Face %d image tokens (+ vision_start, vision_end)", c.w, c.h, got, err, c.tokens)
		}
	}
	if len(shapes) < 20 {
		t.Fatalf("only %d image shapes", len(shapes))
	}
}

func TestQwen3VLCountsEqualHuggingFace(t *testing.T) {
	rule, err := Parse([]byte(`{"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
		"temporal_patch_size": 2, "size": {"longest_edge": 16777216, "shortest_edge": 65536}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	// From testdata/smart_resize_reference.py (factor 32).
	for _, c := range [][5]int{{640, 480, 640, 480, 300}, {1920, 1080, 1920, 1088, 2040}, {100, 100, 256, 256, 64},
		{5000, 5000, 4096, 4096, 16384}, {333, 777, 320, 768, 240}} {
		got, err := rule.Tokens(c[0], c[1])
		if err != nil || got.Image != c[4] {
			t.Errorf("%d×%d: %+v (%v), want %d", c[0], c[1], got, err, c[4])
		}
	}
}

// Sides below the processor's smallest (Qwen: the factor) are refused, as transformers'
// smart_resize refuses them and as 1- and 3-pixel sides break processors (MinSide); the
// factor itself is taken.
func TestQwenSmallSides(t *testing.T) {
	rule, _ := Load("testdata/qwen2_5_vl")
	if rule.MinSide() != 28 {
		t.Fatalf("MinSide %d", rule.MinSide())
	}
	for _, s := range [][2]int{{1, 1}, {14, 14}, {27, 28}, {28, 27}, {7, 1000}, {1000, 3}} {
		if c, err := rule.Tokens(s[0], s[1]); !errors.Is(err, ErrImage) || !strings.Contains(err.Error(), "smallest side of 28") {
			t.Errorf("%d×%d: %+v %v, want a refusal", s[0], s[1], c, err)
		}
	}
	if got, err := rule.Tokens(28, 28); err != nil || got.Image != 4 {
		t.Errorf("28×28: %+v %v, want 4", got, err)
	}
	if _, err := rule.Tokens(201*28, 28); !errors.Is(err, ErrImage) {
		t.Errorf("aspect ratio over 200: %v", err)
	}
	if _, err := rule.Tokens(0, 10); !errors.Is(err, ErrImage) {
		t.Errorf("zero width: %v", err)
	}
}

// Every rule refuses sides under its patch, and counts an image and its quarter turn alike
// (EXIF orientations 5–8 swap the sides for a processor that applies them: the count does not
// move, so the larger of both that request.CountImages charges is this count).
func TestSmallestSideAndQuarterTurns(t *testing.T) {
	for name, r := range testRules(t) {
		if r.MinSide() < 4 {
			t.Errorf("%s: MinSide %d takes 1- and 3-pixel sides", name, r.MinSide())
		}
		for _, s := range [][2]int{{1, 1}, {3, 500}, {500, 3}, {r.MinSide() - 1, 1000}} {
			if _, err := r.Tokens(s[0], s[1]); !errors.Is(err, ErrImage) {
				t.Errorf("%s %d×%d: %v, want a refusal", name, s[0], s[1], err)
			}
		}
		for w := r.MinSide(); w < 15000; w = w*5/4 + 3 {
			for h := r.MinSide(); h < 15000; h = h*4/3 + 1 {
				a, errA := r.Tokens(w, h)
				b, errB := r.Tokens(h, w)
				if a != b || (errA == nil) != (errB == nil) {
					t.Fatalf("%s: %d×%d %+v %v, turned %+v %v", name, w, h, a, errA, b, errB)
				}
			}
		}
	}
}

func testRules(t *testing.T) map[string]*Rule {
	rules := map[string]*Rule{}
	var err error
	if rules["qwen"], err = Load("testdata/qwen2_5_vl"); err != nil {
		t.Fatal(err)
	}
	if rules["llama4"], err = Parse([]byte(`{"image_processor_type": "Llama4ImageProcessorFast", "max_patches": 16, "size": {"height": 336, "width": 336}}`), nil); err != nil {
		t.Fatal(err)
	}
	if rules["gemma3"], err = Parse([]byte(`{"image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256, "size": {"height": 896, "width": 896}}`), nil); err != nil {
		t.Fatal(err)
	}
	return rules
}

// Max bounds every image: no size gives more.
func TestMaxBoundsEveryImage(t *testing.T) {
	rules := testRules(t)
	for name, r := range rules {
		m := r.Max()
		for w := 1; w < 20000; w = w*3/2 + 7 {
			for h := 1; h < 20000; h = h*3/2 + 5 {
				c, err := r.Tokens(w, h)
				if err != nil {
					continue
				}
				if c.Total > m.Total || c.Image > m.Image {
					t.Fatalf("%s %d×%d: %+v over Max %+v", name, w, h, c, m)
				}
			}
		}
	}
}

func TestGemma3(t *testing.T) {
	r, err := Parse([]byte(`{"image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256, "do_pan_and_scan": null}`), []byte(`{"image_seq_length": 256}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range [][2]int{{14, 14}, {896, 896}, {4000, 30}} {
		c, err := r.Tokens(s[0], s[1])
		if err != nil || c.Image != 256 || c.Total != 260 {
			t.Errorf("%v: %+v %v", s, c, err)
		}
	}
	exp, _ := r.Expansion(14, 14)
	if strings.Count(exp, "<image_soft_token>") != 256 || !strings.HasPrefix(exp, "\n\n<start_of_image>") || !strings.HasSuffix(exp, "<end_of_image>\n\n") {
		t.Errorf("expansion %q…", exp[:40])
	}
	if _, err := Parse([]byte(`{"image_processor_type": "Gemma3ImageProcessor", "do_pan_and_scan": true}`), nil); err == nil {
		t.Error("pan and scan accepted")
	}
}

// Llama 4's canvas choice follows transformers' get_best_fit; the docstring's own example
// (200×300 among 224-pixel tiles up to 3 → 224×448) and the token arithmetic of
// Llama4Processor._prompt_split_image.
func TestLlama4(t *testing.T) {
	r := &Rule{Family: Llama4, tile: 224, maxTiles: 3, perTile: 64, placeholder: "<|image|>", rendered: 1}
	if th, tw := r.tiles(200, 300); th != 1 || tw != 2 {
		t.Errorf("get_best_fit example: %d×%d tiles, want 1×2", th, tw)
	}
	r, err := Parse([]byte(`{"image_processor_type": "Llama4ImageProcessorFast", "max_patches": 16, "size": {"height": 336, "width": 336}}`),
		[]byte(`{"patch_size": 14, "pixel_shuffle_ratio": 0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.perTile != 144 {
		t.Fatalf("%d tokens per tile, want (336/14)²/4 = 144", r.perTile)
	}
	for _, c := range []struct{ w, h, th, tw int }{
		{336, 336, 1, 1}, {100, 100, 1, 1}, {672, 336, 1, 2}, {1000, 1000, 3, 3}, {4000, 4000, 4, 4},
		{5000, 300, 1, 15}, {300, 5000, 15, 1}, {700, 336, 1, 3},
	} {
		th, tw := r.tiles(c.h, c.w)
		if th != c.th || tw != c.tw {
			t.Errorf("%d×%d: %d×%d tiles, want %d×%d", c.w, c.h, th, tw, c.th, c.tw)
			continue
		}
		got, err := r.Tokens(c.w, c.h)
		if err != nil {
			t.Fatal(err)
		}
		exp, _ := r.Expansion(c.w, c.h)
		// Every special token of the expansion is one token: count them in the text.
		if n := strings.Count(exp, "<|"); got.Total != n {
			t.Errorf("%d×%d: Total %d, the processor's text holds %d tokens", c.w, c.h, got.Total, n)
		}
		if n := strings.Count(exp, "<|patch|>"); got.Image != n {
			t.Errorf("%d×%d: Image %d, %d patches", c.w, c.h, got.Image, n)
		}
	}
}

func TestParseRefusals(t *testing.T) {
	for name, cfg := range map[string]string{
		"unknown processor": `{"image_processor_type": "CLIPImageProcessor"}`,
		"not json":          `{`,
		"zero patch":        `{"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 0}`,
		"min over max":      `{"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 100000, "max_pixels": 5000}`,
		"llama4 non-square": `{"image_processor_type": "Llama4ImageProcessorFast", "size": {"height": 336, "width": 224}}`,
	} {
		if _, err := Parse([]byte(cfg), nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Load(t.TempDir()); !errors.Is(err, ErrNoRule) {
		t.Errorf("no preprocessor_config.json: %v", err)
	}
}

// BenchmarkTokens is the rule alone, for an image's size.
func BenchmarkTokens(b *testing.B) {
	rule, err := Load("testdata/qwen2_5_vl")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if _, err := rule.Tokens(1024+i%512, 768); err != nil {
			b.Fatal(err)
		}
	}
}
