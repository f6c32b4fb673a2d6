package imagesize

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"
)

// Real files from the standard library's encoders, and WebP headers built by hand (the
// standard library has no WebP encoder).

func rgba(w, h int) *image.RGBA {
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			m.Set(x, y, color.RGBA{uint8(x), uint8(y), uint8(x ^ y), 255})
		}
	}
	return m
}

func encodePNG(t testing.TB, w, h int) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, rgba(w, h)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, w, h int) []byte {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, rgba(w, h), &jpeg.Options{Quality: 80}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeGIF(t testing.TB, w, h int) []byte {
	var b bytes.Buffer
	if err := gif.Encode(&b, rgba(w, h), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// riff wraps one chunk in a RIFF WEBP container.
func riff(chunk string, payload []byte) []byte {
	var b bytes.Buffer
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, uint32(4+8+len(payload)))
	b.WriteString("WEBP")
	b.WriteString(chunk)
	binary.Write(&b, binary.LittleEndian, uint32(len(payload)))
	b.Write(payload)
	return b.Bytes()
}

// webpLossless is a VP8L header: signature 0x2F, then width−1 and height−1 in 14 bits each,
// alpha hint and a zero version.
func webpLossless(w, h int) []byte {
	bits := uint32(w-1) | uint32(h-1)<<14 | 1<<28
	p := []byte{0x2F, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(p[1:5], bits)
	return riff("VP8L", p)
}

// webpExtended is a VP8X header: flags and the 24-bit canvas size minus one.
func webpExtended(w, h int) []byte {
	p := make([]byte, 10)
	p[0] = 0x10 // alpha
	p[4], p[5], p[6] = byte(w-1), byte((w-1)>>8), byte((w-1)>>16)
	p[7], p[8], p[9] = byte(h-1), byte((h-1)>>8), byte((h-1)>>16)
	return riff("VP8X", p)
}

// webpLossy is a VP8 key frame header: frame tag, start code, 14-bit width and height (the top
// two bits a scale, set here to check they are masked).
func webpLossy(w, h int) []byte {
	p := []byte{0x50, 0x2C, 0x01, 0x9D, 0x01, 0x2A, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint16(p[6:8], uint16(w)|1<<14)
	binary.LittleEndian.PutUint16(p[8:10], uint16(h)|2<<14)
	return riff("VP8 ", p)
}

// withAPP inserts metadata segments (APP1 with an EXIF-like payload, COM) between SOI and the
// rest, as cameras write them before the frame header.
func withAPP(jpg []byte, n int) []byte {
	var b bytes.Buffer
	b.Write(jpg[:2])
	for i := 0; i < n; i++ {
		payload := bytes.Repeat([]byte{0xFF, 0xD8, 0xC0}, 20000) // markers inside: skipped by length
		b.Write([]byte{0xFF, 0xE1})
		binary.Write(&b, binary.BigEndian, uint16(len(payload)+2))
		b.Write(payload)
	}
	b.Write([]byte{0xFF, 0xFF, 0xFE, 0x00, 0x05, 'h', 'i', '!'}) // fill byte, then a comment
	b.Write(jpg[2:])
	return b.Bytes()
}

func TestReadRealFiles(t *testing.T) {
	sizes := [][2]int{{1, 1}, {28, 28}, {640, 480}, {480, 640}, {1000, 3}, {3, 1000}, {1023, 769}}
	for _, s := range sizes {
		w, h := s[0], s[1]
		files := map[string][]byte{
			"png": encodePNG(t, w, h), "jpeg": encodeJPEG(t, w, h), "gif": encodeGIF(t, w, h),
			"jpeg+app":  withAPP(encodeJPEG(t, w, h), 3),
			"webp-vp8l": webpLossless(w, h), "webp-vp8x": webpExtended(w, h), "webp-vp8": webpLossy(w, h),
		}
		for name, f := range files {
			got, err := Read(f)
			if err != nil {
				t.Fatalf("%s %d×%d: %v", name, w, h, err)
			}
			if got.Width != w || got.Height != h {
				t.Errorf("%s: read %d×%d, want %d×%d", name, got.Width, got.Height, w, h)
			}
			if !strings.HasPrefix(name, string(got.Format)) {
				t.Errorf("%s: format %q", name, got.Format)
			}
			if !strings.HasPrefix(name, "webp") {
				// The standard library's DecodeConfig agrees.
				cfg, _, err := image.DecodeConfig(bytes.NewReader(f))
				if err != nil || cfg.Width != w || cfg.Height != h {
					t.Errorf("%s: image.DecodeConfig says %d×%d (%v)", name, cfg.Width, cfg.Height, err)
				}
			}
			got64, err := ReadBase64(base64.StdEncoding.EncodeToString(f))
			if err != nil || got64 != got {
				t.Errorf("%s: base64 read %+v, %v; raw %+v", name, got64, err, got)
			}
		}
	}
}

// Every prefix of a real file that stops before its dimensions is an error, never a size.
func TestTruncatedHeadersAreErrors(t *testing.T) {
	for name, f := range map[string][]byte{"png": encodePNG(t, 30, 20), "jpeg": withAPP(encodeJPEG(t, 30, 20), 1),
		"gif": encodeGIF(t, 30, 20), "vp8l": webpLossless(30, 20), "vp8x": webpExtended(30, 20), "vp8": webpLossy(30, 20)} {
		ok := 0
		for n := 0; n <= len(f); n++ {
			s, err := Read(f[:n])
			if err == nil {
				if s.Width != 30 || s.Height != 20 {
					t.Fatalf("%s prefix %d: %+v", name, n, s)
				}
				ok++
				continue
			}
			if s != (Size{}) {
				t.Fatalf("%s prefix %d: error %v with a size %+v", name, n, err, s)
			}
		}
		if ok == 0 {
			t.Fatalf("%s: no prefix read", name)
		}
	}
}

func TestMalformedHeaders(t *testing.T) {
	png0 := encodePNG(t, 10, 10)
	badCRC := bytes.Clone(png0)
	badCRC[20] ^= 1 // the height changes, the checksum does not
	zeroPNG := bytes.Clone(png0)
	copy(zeroPNG[16:24], make([]byte, 8))
	binary.BigEndian.PutUint32(zeroPNG[29:33], crc32.ChecksumIEEE(zeroPNG[12:29]))
	hugePNG := bytes.Clone(png0)
	binary.BigEndian.PutUint32(hugePNG[16:20], 100000)
	binary.BigEndian.PutUint32(hugePNG[20:24], 100000)
	binary.BigEndian.PutUint32(hugePNG[29:33], crc32.ChecksumIEEE(hugePNG[12:29]))
	jpg := encodeJPEG(t, 10, 10)
	sosFirst := append([]byte{0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02}, jpg[2:]...)
	badLen := []byte{0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x01, 0, 0, 0, 0, 0, 0}
	noMarker := []byte{0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0, 0, 0x12, 0x34, 0, 0}
	vp8Inter := webpLossy(10, 10)
	vp8Inter[20] |= 1
	vp8lVersion := webpLossless(10, 10)
	vp8lVersion[24] |= 0x20
	for name, b := range map[string][]byte{
		"empty": {}, "text": []byte("hello, this is no image at all"), "bmp": append([]byte("BM"), make([]byte, 60)...),
		"png bad crc": badCRC, "png zero size": zeroPNG, "png over the pixel limit": hugePNG,
		"jpeg scan first": sosFirst, "jpeg bad length": badLen, "jpeg no marker": noMarker,
		"webp inter frame": vp8Inter, "webp vp8l version": vp8lVersion, "webp unknown chunk": riff("ALPH", make([]byte, 16)),
		"gif zero": append([]byte("GIF89a"), 0, 0, 5, 0),
	} {
		if s, err := Read(b); err == nil {
			t.Errorf("%s: read %+v, want an error", name, s)
		}
	}
}

func TestBase64Errors(t *testing.T) {
	png0 := base64.StdEncoding.EncodeToString(encodePNG(t, 12, 7))
	for name, s := range map[string]string{
		"empty": "", "not base64": "!!!!" + png0, "bad in the tail": png0[:len(png0)-8] + "*&^%$#@!",
		"cut in the header": png0[:20], "text": base64.StdEncoding.EncodeToString([]byte("plain text, no image here")),
	} {
		if sz, err := ReadBase64(s); err == nil {
			t.Errorf("%s: read %+v, want an error", name, sz)
		}
	}
	// Line breaks are ignored (as Python's decoder ignores them), padding is optional.
	var wrapped strings.Builder
	for i := 0; i < len(png0); i += 76 {
		wrapped.WriteString(png0[min(i, len(png0)):min(i+76, len(png0))])
		wrapped.WriteString("\r\n")
	}
	for _, s := range []string{wrapped.String(), strings.TrimRight(png0, "=")} {
		if sz, err := ReadBase64(s); err != nil || sz.Width != 12 || sz.Height != 7 {
			t.Errorf("read %+v, %v", sz, err)
		}
	}
	// A JPEG whose frame header lies beyond MaxHeaderBytes is refused, not scanned forever.
	far := withAPP(encodeJPEG(t, 8, 8), MaxHeaderBytes/60000+2)
	if _, err := ReadBase64(base64.StdEncoding.EncodeToString(far)); err == nil || errors.Is(err, ErrUnknownFormat) {
		t.Errorf("far frame header: %v", err)
	}
}
