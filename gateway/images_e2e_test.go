package gateway_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
	"github.com/kvgate/kvgate/tokenize/vision"
)

// imageURL is a real image file from the standard library's encoders as a base64 data URL.
func imageURL(t testing.TB, format string, w, h int) string {
	t.Helper()
	m := image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black, color.White})
	for i := 0; i < min(w, h); i++ {
		m.SetColorIndex(i, i, 1)
	}
	var b bytes.Buffer
	var err error
	switch format {
	case "png":
		err = png.Encode(&b, m)
	case "jpeg":
		err = jpeg.Encode(&b, m, nil)
	case "gif":
		err = gif.Encode(&b, m, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return "data:image/" + format + ";base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

func imageChat(text string, urls ...string) string {
	parts := []string{fmt.Sprintf(`{"type":"text","text":%q}`, text)}
	for _, u := range urls {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q}}`, u))
	}
	return `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`
}

// With tokenizer.hf_dir naming a Qwen2.5-VL model directory (its chat template and
// preprocessor_config.json), in front of a simulator serving the same directory (which renders
// the template with the image parts, expands each <|image_pad|> as the processor does and
// tokenizes the result): images are counted as the engine counts them (X-Kvgate-Tokens equals
// the engine's prompt_tokens), an image prompt over the pool is refused with 413 before the
// engine is contacted (the simulator's request count does not move, and the engine itself would
// have refused it), and bad images are 400s naming the part, also before the engine.
func TestImagesCountedAgainstThePool(t *testing.T) {
	dir := hfref.QwenVLDir(t)
	rule, err := vision.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "hf:"+dir, "--pool-tokens", "2048", "--context-length", "4096")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML(fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir), [3]string{"sim", sim.URL, "unified"})))
	const chat = "/v1/chat/completions"

	fits := []string{
		imageChat("What is this?", imageURL(t, "png", 100, 100)),
		imageChat("Compare", imageURL(t, "jpeg", 640, 480), imageURL(t, "gif", 70, 70)),
		imageChat("Tall", imageURL(t, "png", 60, 1500)),
		imageChat("Two and text", imageURL(t, "gif", 333, 777), imageURL(t, "png", 28, 28)),
	}
	for i, body := range fits {
		r := post(t, gw.URL, chat, tenantKey, body)
		if r.status != 200 {
			t.Fatalf("body %d: %d %s", i, r.status, r.body)
		}
		var resp struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(r.body, &resp); err != nil || resp.Usage.PromptTokens == 0 {
			t.Fatalf("body %d: no usage in %s", i, r.body)
		}
		// The engine's count includes the marker the gateway injected: the gateway counted the
		// same prompt.
		if got := r.header.Get("X-Kvgate-Tokens"); got != fmt.Sprint(resp.Usage.PromptTokens) {
			t.Errorf("body %d: X-Kvgate-Tokens %s, the engine counted %d", i, got, resp.Usage.PromptTokens)
		}
	}

	over := imageChat("Describe", imageURL(t, "png", 2000, 2000))
	c, _ := rule.Tokens(2000, 2000)
	if c.Image <= 2048 {
		t.Fatalf("the large image makes %d tokens: not over the pool", c.Image)
	}
	before := sim.Stats(t).Requests[chat]
	r := post(t, gw.URL, chat, tenantKey, over)
	if r.status != 413 || !strings.Contains(string(r.body), "context_length_exceeded") {
		t.Fatalf("over the pool: %d %s", r.status, r.body)
	}
	if got, _ := strconv.Atoi(r.header.Get("X-Kvgate-Tokens")); got < c.Image {
		t.Errorf("refused with X-Kvgate-Tokens %d, the image alone makes %d", got, c.Image)
	}
	bad := []struct{ body, param string }{
		{imageChat("x", "data:image/png;base64,iVBORw0KGgo="), "messages[0].content[1].image_url"},
		{imageChat("x", "data:image/png;base64,@@@@"), "messages[0].content[1].image_url"},
		{imageChat("x", "https://example.com/cat.png"), "messages[0].content[1].image_url"},
		{imageChat("x", imageURL(t, "gif", 6000, 20)), "messages[0].content[1].image_url"},
	}
	for _, b := range bad {
		r := post(t, gw.URL, chat, tenantKey, b.body)
		var e errorBody
		_ = json.Unmarshal(r.body, &e)
		if r.status != 400 || e.Error.Param == nil || *e.Error.Param != b.param {
			t.Errorf("bad image: %d %s, want 400 naming %s", r.status, r.body, b.param)
		}
	}
	if after := sim.Stats(t).Requests[chat]; after != before {
		t.Fatalf("the engine got %d requests for prompts the gateway refused", after-before)
	}
	// The same image through Anthropic's Messages and OpenAI's Responses routes.
	big := imageURL(t, "png", 2000, 2000)
	b64 := strings.TrimPrefix(big, "data:image/png;base64,")
	for path, body := range map[string]string{
		"/v1/messages": `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` +
			b64 + `"}},{"type":"text","text":"Describe"}]}]}`,
		"/v1/responses": `{"model":"m","max_output_tokens":1,"input":[{"role":"user","content":[{"type":"input_text","text":"Describe"},{"type":"input_image","image_url":"` +
			big + `"}]}]}`,
	} {
		n := sim.Stats(t).Requests[path]
		r := post(t, gw.URL, path, tenantKey, body)
		if got, _ := strconv.Atoi(r.header.Get("X-Kvgate-Tokens")); r.status != 413 || got < c.Image {
			t.Errorf("%s: %d (X-Kvgate-Tokens %d) %s, want 413 counting the image's %d", path, r.status, got, r.body, c.Image)
		}
		if sim.Stats(t).Requests[path] != n {
			t.Errorf("%s: the engine was contacted", path)
		}
	}
	// The engine itself would have refused the large one: the gateway's 413 is the engine's
	// verdict, given first.
	if r := post(t, sim.URL, chat, "", over); r.status != 400 {
		t.Fatalf("the engine took the image prompt over its pool: %d %s", r.status, r.body)
	}
}
