package request

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/jpeg"
	"image/png"
	"math/rand"
	"testing"

	json "github.com/goccy/go-json"
)

// photo is a data URL of a w×h image of noise (it compresses like a photograph, not like a
// flat test pattern), as PNG or JPEG.
func photo(b *testing.B, format string, w, h int) string {
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	rng := rand.New(rand.NewSource(1))
	for i := range m.Pix {
		m.Pix[i] = uint8(rng.Intn(256))
	}
	for i := 3; i < len(m.Pix); i += 4 {
		m.Pix[i] = 255
	}
	var buf bytes.Buffer
	var err error
	if format == "png" {
		err = png.Encode(&buf, m)
	} else {
		err = jpeg.Encode(&buf, m, &jpeg.Options{Quality: 85})
	}
	if err != nil {
		b.Fatal(err)
	}
	return "data:image/" + format + ";base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
}

// BenchmarkImagePart is the cost of counting one chat image part: reading the part, decoding
// its base64 (header first, then the rest checked in a fixed buffer) and the Qwen2.5-VL rule.
// SetBytes is the data URL's length, so MB/s is the base64 throughput.
func BenchmarkImagePart(b *testing.B) {
	rule, err := loadRule()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		format string
		w, h   int
	}{{"png", 64, 64}, {"jpeg", 1024, 768}, {"png", 1024, 768}} {
		url := photo(b, c.format, c.w, c.h)
		var part map[string]json.RawMessage
		if err := json.Unmarshal([]byte(fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q}}`, url)), &part); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s-%dx%d-%dKiB", c.format, c.w, c.h, len(url)>>10), func(b *testing.B) {
			b.SetBytes(int64(len(url)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				img, e := chatImage("messages[0].content[0]", part)
				if e != nil {
					b.Fatal(e)
				}
				if _, err := rule.Tokens(img.Size.Width, img.Size.Height); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
