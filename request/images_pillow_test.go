package request

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	stdjson "encoding/json"

	"github.com/kvgate/kvgate/tokenize/vision"
)

// pillowDir is tokenize/imagesize's corpus: hand-built files and what Pillow 9.4 made of each.
const pillowDir = "../tokenize/imagesize/testdata/pillow"

type pillowResult struct {
	Size, Transposed []int
	Loads            bool
	LoadSkipped      bool `json:"load_skipped"`
	Error            string
}

// Every image of the Pillow corpus, sent as a chat image part and counted by a Qwen2.5-VL and a
// Llama 4 rule, is charged at least what the processor makes of it as Pillow opens it, and of
// it turned by its EXIF orientation (exif_transpose), or refused with a 400 naming the part;
// an image Pillow decodes and the processor takes is never refused.
func TestImagesChargedAtLeastPillowAndTheProcessor(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(pillowDir, "pillow.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pillow map[string]pillowResult
	if err := stdjson.Unmarshal(raw, &pillow); err != nil {
		t.Fatal(err)
	}
	llama4, err := vision.Parse([]byte(`{"image_processor_type": "Llama4ImageProcessorFast", "max_patches": 16, "size": {"height": 336, "width": 336}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]*vision.Rule{"qwen2.5-vl": qwenRule(t), "llama4": llama4}
	const field = "messages[1].content[0].image_url"
	checked := 0
	for name, p := range pillow {
		if p.Error != "" {
			continue // Pillow cannot open it: the engine refuses it whatever is charged
		}
		f, err := os.ReadFile(filepath.Join(pillowDir, name))
		if err != nil {
			t.Fatal(err)
		}
		url := "data:image/x;base64," + base64.StdEncoding.EncodeToString(f)
		for rn, rule := range rules {
			r, e := Parse(Chat, []byte(chatBody(imagePart(url))))
			if e == nil {
				r.Render()
				e = r.CountImages(rule, false)
			}
			want, errOpen := rule.Tokens(p.Size[0], p.Size[1])
			turned, errTurned := rule.Tokens(p.Transposed[0], p.Transposed[1])
			decodes := p.Loads || p.LoadSkipped
			switch {
			case e != nil:
				if e.Status != 400 || e.Param != field {
					t.Errorf("%s %s: %+v, want a 400 naming %s", name, rn, e, field)
				}
				if decodes && errOpen == nil && errTurned == nil {
					t.Errorf("%s %s: refused (%s), but Pillow decodes it and the processor takes it", name, rn, e.Message)
				}
			case errOpen == nil && r.Prompts[0].ImageTokens < want.Total,
				errTurned == nil && r.Prompts[0].ImageTokens < turned.Total:
				t.Errorf("%s %s: charged %d, Pillow + the processor make %d (turned: %d)", name, rn, r.Prompts[0].ImageTokens, want.Total, turned.Total)
			default:
				checked++
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d images counted", checked)
	}
	// Issue 39's GIF: 3584×3584 to Pillow, 16,386 Qwen2.5-VL tokens (was charged 6).
	f, _ := os.ReadFile(filepath.Join(pillowDir, "gif_issue39_35_bytes.gif"))
	r, _ := Parse(Chat, []byte(chatBody(imagePart("data:image/gif;base64,"+base64.StdEncoding.EncodeToString(f)))))
	r.Render()
	if e := r.CountImages(qwenRule(t), false); e != nil || len(f) != 35 || r.Prompts[0].ImageTokens != 16386 {
		t.Fatalf("issue 39's GIF (%d bytes): charged %d (%+v), want 16386", len(f), r.Prompts[0].ImageTokens, e)
	}
}
