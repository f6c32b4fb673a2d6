package imagesize

import (
	"bytes"
	"encoding/base64"
	"image"
	"testing"
)

// FuzzRead: any bytes give a size within bounds or an error, never a panic or a zero size; a
// size read from a prefix is the size read from the whole; for the formats the standard library
// decodes, a size it also reads agrees; base64 of the bytes reads the same.
func FuzzRead(f *testing.F) {
	for _, s := range [][2]int{{1, 1}, {17, 5}, {300, 200}} {
		f.Add(encodePNG(f, s[0], s[1]))
		f.Add(withAPP(encodeJPEG(f, s[0], s[1]), 1))
		f.Add(encodeGIF(f, s[0], s[1]))
		f.Add(webpLossless(s[0], s[1]))
		f.Add(webpExtended(s[0], s[1]))
		f.Add(webpLossy(s[0], s[1]))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Read(b)
		if err != nil {
			if s != (Size{}) {
				t.Fatalf("error %v with size %+v", err, s)
			}
			return
		}
		if s.Width <= 0 || s.Height <= 0 || int64(s.Width)*int64(s.Height) > MaxPixels || s.Format == "" {
			t.Fatalf("size %+v", s)
		}
		if s2, err := Read(append(bytes.Clone(b), 0, 1, 2, 3)); err != nil || s2 != s {
			t.Fatalf("more bytes after the header changed the size: %+v %v, was %+v", s2, err, s)
		}
		if s.Format == PNG || s.Format == GIF {
			if cfg, _, err := image.DecodeConfig(bytes.NewReader(b)); err == nil && (cfg.Width != s.Width || cfg.Height != s.Height) {
				t.Fatalf("DecodeConfig %d×%d, Read %+v", cfg.Width, cfg.Height, s)
			}
		}
		if s64, err := ReadBase64(base64.StdEncoding.EncodeToString(b)); err != nil || s64 != s {
			t.Fatalf("base64: %+v %v, raw %+v", s64, err, s)
		}
	})
}
