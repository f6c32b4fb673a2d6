package request

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"

	stdjson "encoding/json"

	"github.com/kvgate/kvgate/tokenize/vision"
)

// Real image files from the standard library's encoders (a two-colour palette keeps large ones
// cheap), as base64 data URLs.

func paletted(w, h int) *image.Paletted {
	m := image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{color.Black, color.White})
	for i := 0; i < min(w, h); i++ {
		m.SetColorIndex(i, i, 1)
	}
	return m
}

func dataURL(t testing.TB, format string, w, h int) string {
	t.Helper()
	var b bytes.Buffer
	var err error
	switch format {
	case "png":
		err = png.Encode(&b, paletted(w, h))
	case "jpeg":
		err = jpeg.Encode(&b, paletted(w, h), nil)
	case "gif":
		err = gif.Encode(&b, paletted(w, h), nil)
	case "webp": // a VP8L header: the standard library has no WebP encoder
		bits := uint32(w-1) | uint32(h-1)<<14
		p := []byte{0x2F, 0, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(p[1:5], bits)
		b.WriteString("RIFF")
		binary.Write(&b, binary.LittleEndian, uint32(4+8+len(p)))
		b.WriteString("WEBPVP8L")
		binary.Write(&b, binary.LittleEndian, uint32(len(p)))
		b.Write(p)
	}
	if err != nil {
		t.Fatal(err)
	}
	return "data:image/" + format + ";base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

func imagePart(url string) string {
	return fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q,"detail":"auto"}}`, url)
}

func chatBody(parts ...string) string {
	return `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[` + strings.Join(parts, ",") + `]}],"max_tokens":4}`
}

func qwenRule(t testing.TB) *vision.Rule {
	t.Helper()
	r, err := vision.Load("../tokenize/vision/testdata/qwen2_5_vl")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestChatImagesAreRead(t *testing.T) {
	body := chatBody(`{"type":"text","text":"What is in these?"}`, imagePart(dataURL(t, "png", 640, 480)),
		imagePart(dataURL(t, "jpeg", 33, 1000)), `{"type":"text","text":"and"}`, imagePart(dataURL(t, "gif", 70, 70)),
		imagePart(dataURL(t, "webp", 3000, 2000)))
	r, e := Parse(Chat, []byte(body))
	if e != nil {
		t.Fatal(e)
	}
	want := []struct {
		field  string
		format string
		w, h   int
	}{{"messages[1].content[1].image_url", "png", 640, 480}, {"messages[1].content[2].image_url", "jpeg", 33, 1000},
		{"messages[1].content[4].image_url", "gif", 70, 70}, {"messages[1].content[5].image_url", "webp", 3000, 2000}}
	if len(r.Images) != len(want) {
		t.Fatalf("%d images: %+v", len(r.Images), r.Images)
	}
	for i, w := range want {
		im := r.Images[i]
		if im.Field != w.field || string(im.Size.Format) != w.format || im.Size.Width != w.w || im.Size.Height != w.h || im.Remote {
			t.Errorf("image %d: %+v, want %+v", i, im, w)
		}
	}
	if r.contents[1] != "What is in these?   and" && !strings.Contains(r.contents[1], "What is in these?") {
		t.Errorf("text %q", r.contents[1])
	}
	if strings.Contains(r.OwnText(), "base64") {
		t.Error("the own text holds the image data")
	}
	rule := qwenRule(t)
	r.Render()
	if e := r.CountImages(rule, false); e != nil {
		t.Fatal(e)
	}
	total := 0
	for _, w := range want {
		c, err := rule.Tokens(w.w, w.h)
		if err != nil {
			t.Fatal(err)
		}
		total += c.Total
	}
	// ChatML (no model template) renders no placeholder: every image is charged whole.
	if r.Prompts[0].ImageTokens != total {
		t.Fatalf("charged %d, want %d", r.Prompts[0].ImageTokens, total)
	}
}

// Every bad image is a 400 naming the part, before any count.
func TestImageRefusals(t *testing.T) {
	png0 := dataURL(t, "png", 20, 20)
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(png0, "data:image/png;base64,"))
	huge := bytes.Clone(raw)
	binary.BigEndian.PutUint32(huge[16:20], 70000)
	binary.BigEndian.PutUint32(huge[20:24], 70000)
	binary.BigEndian.PutUint32(huge[29:33], crc32.ChecksumIEEE(huge[12:29]))
	b64 := base64.StdEncoding.EncodeToString
	const img = "messages[1].content[1].image_url"
	for _, c := range []struct{ name, part, param string }{
		{"bad base64", imagePart("data:image/png;base64,%%%%" + png0[30:]), img},
		{"truncated", imagePart("data:image/png;base64," + b64(raw[:20])), img},
		{"unknown format", imagePart("data:image/bmp;base64," + b64(append([]byte("BM"), make([]byte, 64)...))), img},
		{"absurd size", imagePart("data:image/png;base64," + b64(huge)), img},
		{"empty data", imagePart("data:image/png;base64,"), img},
		{"not base64 data URL", imagePart("data:image/png,abc"), img},
		{"file path", imagePart("/etc/passwd"), img},
		{"bare base64", imagePart(b64(raw)), img},
		{"other scheme", imagePart("ftp://example.com/x.png"), img},
		{"unknown key", `{"type":"image_url","image_url":{"url":"` + png0 + `","size":1}}`, img + ".size"},
		{"bad detail", `{"type":"image_url","image_url":{"url":"` + png0 + `","detail":"max"}}`, img + ".detail"},
		{"no url", `{"type":"image_url","image_url":{}}`, img},
		{"image_url a string", `{"type":"image_url","image_url":"` + png0 + `"}`, img},
		{"audio", `{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}`, "messages[1].content"},
		{"video", `{"type":"video_url","video_url":{"url":"http://x"}}`, "messages[1].content"},
	} {
		_, e := Parse(Chat, []byte(chatBody(`{"type":"text","text":"hi"}`, c.part)))
		if e == nil || e.Status != 400 || e.Param != c.param {
			t.Errorf("%s: %+v, want 400 naming %s", c.name, e, c.param)
		}
	}
}

func TestCountImagesRules(t *testing.T) {
	rule := qwenRule(t)
	remote := chatBody(`{"type":"text","text":"hi"}`, imagePart("https://example.com/cat.png"))
	r, e := Parse(Chat, []byte(remote))
	if e != nil {
		t.Fatal(e)
	}
	r.Render()
	if e := r.CountImages(nil, true); e == nil || e.Param != "messages[1].content[1].image_url" {
		t.Fatalf("no rule: %+v", e)
	}
	if e := r.CountImages(rule, false); e == nil || !strings.Contains(e.Message, "not fetched") {
		t.Fatalf("remote refused by default: %+v", e)
	}
	if e := r.CountImages(rule, true); e != nil || r.Prompts[0].ImageTokens != rule.Max().Total || rule.Max().Image != 12845056/(28*28) {
		t.Fatalf("remote at max: %+v %d, max %+v", e, r.Prompts[0].ImageTokens, rule.Max())
	}
	// An aspect ratio the processor refuses.
	r, _ = Parse(Chat, []byte(chatBody(imagePart(dataURL(t, "gif", 5000, 10)))))
	r.Render()
	if e := r.CountImages(rule, false); e == nil || e.Param != "messages[1].content[0].image_url" {
		t.Fatalf("ratio over 200: %+v", e)
	}
	// No images: nothing charged, no rule needed.
	r, _ = Parse(Chat, []byte(chatBody(`{"type":"text","text":"hi"}`)))
	r.Render()
	if e := r.CountImages(nil, false); e != nil || r.Prompts[0].ImageTokens != 0 {
		t.Fatalf("text only: %+v %d", e, r.Prompts[0].ImageTokens)
	}
}

// partsEcho is a chat template that takes parts and renders what it was given: the messages as
// JSON, with a Qwen placeholder per image part.
type partsEcho struct{ got []map[string]any }

func (p *partsEcho) RendersParts() bool { return true }
func (p *partsEcho) Render(messages, _ stdjson.RawMessage, _ bool, _ stdjson.RawMessage) (string, error) {
	p.got = nil
	if err := stdjson.Unmarshal(messages, &p.got); err != nil {
		return "", err
	}
	n := strings.Count(string(messages), `"type":"image"`)
	return string(messages) + strings.Repeat("<|vision_start|><|image_pad|><|vision_end|>", n), nil
}

// The marker goes into a text part beside the images (every injection path), the template gets
// the images as {"type": "image"} parts in their places, and its placeholders are not charged
// twice.
func TestInjectAndRenderWithImages(t *testing.T) {
	const marker = "KVG-abcdefghijklmnopqrst"
	rule := qwenRule(t)
	pic := dataURL(t, "png", 100, 100) // 16 image tokens
	for _, body := range []string{
		chatBody(`{"type":"text","text":"look"}`, imagePart(pic)),
		`{"messages":[{"role":"user","content":[` + imagePart(pic) + `,{"type":"text","text":"look"}]}]}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"sys"},` + imagePart(pic) + `]},{"role":"user","content":"look"}]}`,
	} {
		for _, c := range []struct {
			every  int
			prefix bool
		}{{0, false}, {0, true}, {8, false}} {
			r, e := Parse(Chat, []byte(body))
			if e != nil {
				t.Fatal(e)
			}
			if !r.Inject(marker, c.every, c.prefix) {
				t.Fatal("not injected")
			}
			var msgs []map[string]any
			if err := stdjson.Unmarshal(r.Fields["messages"], &msgs); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(r.Fields["messages"]), pic) {
				t.Fatalf("%s: the image left the body", body)
			}
			if !strings.Contains(r.OwnText(), marker) || !strings.Contains(r.OwnText(), "look") || strings.Contains(r.OwnText(), pic[30:60]) {
				t.Fatalf("own text %q", r.OwnText())
			}
			r.Render()
			tmpl := &partsEcho{}
			if e := r.RenderTemplate(tmpl); e != nil {
				t.Fatal(e)
			}
			rendered := r.Prompts[0].Text
			if !strings.Contains(rendered, marker) || !strings.Contains(rendered, `{"type":"image"}`) || strings.Contains(rendered, "base64") {
				t.Fatalf("rendered %s", rendered)
			}
			images, markerInText := 0, false
			for _, m := range tmpl.got {
				parts, ok := m["content"].([]any)
				if !ok {
					markerInText = markerInText || strings.Contains(fmt.Sprint(m["content"]), marker)
					continue
				}
				for _, p := range parts {
					pm := p.(map[string]any)
					switch pm["type"] {
					case "image":
						images++
					case "text":
						markerInText = markerInText || strings.Contains(pm["text"].(string), marker)
					default:
						t.Fatalf("part %v", pm)
					}
				}
			}
			if images != 1 || !markerInText {
				t.Fatalf("%s (%+v): template got %d images, marker in text %v: %v", body, c, images, markerInText, tmpl.got)
			}
			if e := r.CountImages(rule, false); e != nil {
				t.Fatal(e)
			}
			if got := r.Prompts[0].ImageTokens; got != 16-1 {
				t.Fatalf("charged %d beyond the rendering, want 16 pads − the one rendered", got)
			}
		}
	}
}

func TestResponsesAndMessagesImages(t *testing.T) {
	pic := dataURL(t, "jpeg", 640, 480)
	b64 := strings.TrimPrefix(pic, "data:image/jpeg;base64,")
	r, e := Parse(Responses, []byte(`{"input":[{"role":"user","content":[{"type":"input_text","text":"what"},{"type":"input_image","image_url":"`+pic+`","detail":"auto"}]}]}`))
	if e != nil {
		t.Fatal(e)
	}
	if len(r.Images) != 1 || r.Images[0].Field != "input[0].content[1].image_url" || r.Images[0].Size.Width != 640 {
		t.Fatalf("responses: %+v", r.Images)
	}
	r, e = Parse(Messages, []byte(`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"`+b64+`"}},{"type":"text","text":"what"}]}]}`))
	if e != nil {
		t.Fatal(e)
	}
	if len(r.Images) != 1 || r.Images[0].Field != "messages.0.content.0.source" || r.Images[0].Size.Height != 480 {
		t.Fatalf("messages: %+v", r.Images)
	}
	r.Inject("KVG-abcdefghijklmnopqrst", 0, false)
	r.Render()
	tmpl := &partsEcho{}
	if e := r.RenderTemplate(tmpl); e != nil {
		t.Fatal(e)
	}
	if !strings.Contains(r.Prompts[0].Text, `{"type":"image"}`) || !strings.Contains(r.Prompts[0].Text, "what") {
		t.Fatalf("rendered %s", r.Prompts[0].Text)
	}
	for _, c := range []struct {
		route       Kind
		body, param string
	}{
		{Responses, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}]}`, "input[0].content[0].image_url"},
		{Responses, `{"input":[{"role":"user","content":[{"type":"input_image","file_id":"file-1"}]}]}`, "input[0].content[0].file_id"},
		{Messages, `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"!!"}}]}]}`, "messages.0.content.0.source"},
		{Messages, `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages[0].content[0].source.file_id"},
	} {
		if _, e := Parse(c.route, []byte(c.body)); e == nil || e.Param != c.param {
			t.Errorf("%s: %+v, want 400 naming %s", c.body, e, c.param)
		}
	}
	r, _ = Parse(Messages, []byte(`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}]}`))
	if r == nil || len(r.Images) != 1 || !r.Images[0].Remote {
		t.Fatalf("remote image block: %+v", r)
	}
}

func loadRule() (*vision.Rule, error) { return vision.Load("../tokenize/vision/testdata/qwen2_5_vl") }
