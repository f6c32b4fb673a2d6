package imagesize

import (
	"bytes"
	"encoding/base64"
	"image"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzRead: any bytes give a size within bounds or an error, never a panic or a zero size; a
// size read from a prefix is the size read from the whole; the standard library's decoder
// reads a PNG's size as Pillow does, and a GIF's screen, which Pillow's size covers (it grows to
// the first frame: Go's DecodeConfig is a lower bound there, not the reference); base64 of the
// bytes reads the same. The reference is Pillow: pillow_test.go and the fuzzers below.
func FuzzRead(f *testing.F) {
	for _, s := range [][2]int{{1, 1}, {17, 5}, {300, 200}} {
		f.Add(encodePNG(f, s[0], s[1]))
		f.Add(withAPP(encodeJPEG(f, s[0], s[1]), 1))
		f.Add(encodeGIF(f, s[0], s[1]))
		f.Add(webpLossless(s[0], s[1]))
		f.Add(webpExtended(s[0], s[1]))
		f.Add(webpLossy(s[0], s[1]))
	}
	// And every file of the Pillow corpus.
	names, _ := filepath.Glob(filepath.Join(corpusDir, "*.*"))
	for _, n := range names {
		if b, err := os.ReadFile(n); err == nil && !strings.HasSuffix(n, ".py") && !strings.HasSuffix(n, ".json") {
			f.Add(b)
		}
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
			cfg, _, err := image.DecodeConfig(bytes.NewReader(b))
			if err == nil && (s.Format == PNG && (cfg.Width != s.Width || cfg.Height != s.Height) || cfg.Width > s.Width || cfg.Height > s.Height) {
				t.Fatalf("DecodeConfig %d×%d, Read %+v", cfg.Width, cfg.Height, s)
			}
		}
		if s64, err := ReadBase64(base64.StdEncoding.EncodeToString(b)); err != nil || s64 != s {
			t.Fatalf("base64: %+v %v, raw %+v", s64, err, s)
		}
	})
}

// FuzzGIFFirstFrame builds GIFs as GifImagePlugin reads them (extensions of any sub-blocks, stray
// bytes, a first frame anywhere, a second frame anywhere) and checks the size is Pillow's:
// the screen grown to the first frame's right and bottom edges (lines 282–286), the second
// frame ignored; over the pixel limit, refused (Pillow's decompression bomb error).
func FuzzGIFFirstFrame(f *testing.F) {
	f.Add(uint16(28), uint16(28), uint16(3583), uint16(3583), uint16(1), uint16(1), []byte{}, uint16(0), uint16(0))
	f.Add(uint16(20), uint16(10), uint16(15), uint16(5), uint16(30), uint16(30), []byte("comment\x00"), uint16(9000), uint16(9000))
	f.Add(uint16(65535), uint16(2), uint16(0), uint16(65535), uint16(3), uint16(2), []byte{0x21, 0x3b, 0x2c}, uint16(1), uint16(1))
	f.Fuzz(func(t *testing.T, sw, sh, x, y, w, h uint16, ext []byte, x2, y2 uint16) {
		if w == 0 || h == 0 || int(w)*int(h) > 1<<16 {
			return // frame pixels are LZW-coded below: keep them small
		}
		// ext becomes a comment extension (its bytes in sub-blocks of up to 7) then stray bytes
		// that are none of '!', ',' and ';' (Pillow skips them).
		var extra bytes.Buffer
		extra.WriteString("!\xfe")
		for p := ext; len(p) > 0; {
			n := min(len(p), 7)
			extra.WriteByte(byte(n))
			extra.Write(p[:n])
			p = p[n:]
		}
		extra.WriteByte(0)
		for _, c := range ext {
			if c != '!' && c != ',' && c != ';' {
				extra.WriteByte(c)
			}
		}
		b := gifFile(int(sw), int(sh), extra.Bytes(), gifFrame{int(x), int(y), int(w), int(h)}, gifFrame{int(x2), int(y2), 1, 1})
		wantW, wantH := max(int(sw), int(x)+int(w)), max(int(sh), int(y)+int(h))
		s, err := Read(b)
		if int64(wantW)*int64(wantH) > MaxPixels {
			if err == nil {
				t.Fatalf("%d×%d over the pixel limit read as %+v", wantW, wantH, s)
			}
			return
		}
		if err != nil || s.Width != wantW || s.Height != wantH {
			t.Fatalf("screen %d×%d, frame %d×%d at %d,%d: read %+v %v, Pillow %d×%d", sw, sh, w, h, x, y, s, err, wantW, wantH)
		}
	})
}

// FuzzJPEGFrameHeader builds JPEGs as JpegImagePlugin walks them (junk between segments, fill
// bytes, lengthless JPGn markers, an EXIF thumbnail with a frame header of its own, a second
// frame header) and checks the size is Pillow's frame header, or a refusal when there are two
// (libjpeg refuses those files).
func FuzzJPEGFrameHeader(f *testing.F) {
	f.Add(uint16(40), uint16(30), []byte("junk"), uint8(2), true, false, uint16(4000), uint16(3000))
	f.Add(uint16(1), uint16(1), []byte{}, uint8(0), false, true, uint16(9), uint16(9))
	f.Fuzz(func(t *testing.T, w, h uint16, junk []byte, fill uint8, jpgn, second bool, w2, h2 uint16) {
		var b bytes.Buffer
		b.Write([]byte{0xFF, 0xD8})
		thumb := cat([]byte("Exif\x00\x00"), exifTIFF(6), []byte{0xFF, 0xD8}, sof0(int(w2), int(h2)), []byte{0xFF, 0xD9})
		b.Write(jpegSegment(0xE1, thumb))
		for _, c := range junk {
			if c != 0xFF {
				b.WriteByte(c)
			}
		}
		b.Write(bytes.Repeat([]byte{0xFF}, int(fill%8)))
		if jpgn {
			b.Write([]byte{0xFF, 0xF3})
		}
		b.Write(sof0(int(w), int(h)))
		if second {
			b.Write(sof0(int(w2), int(h2)))
		}
		b.Write(jpegSegment(0xDA, []byte{3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0}))
		s, err := Read(b.Bytes())
		switch {
		case second || w == 0 || h == 0:
			if err == nil {
				t.Fatalf("read %+v, want a refusal", s)
			}
		case err != nil || s.Width != int(w) || s.Height != int(h):
			t.Fatalf("read %+v %v, Pillow %d×%d", s, err, w, h)
		}
	})
}
