package imagesize

import (
	"bytes"
	"compress/lzw"
	"compress/zlib"
	"encoding/binary"
	"encoding/json"
	"flag"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The Pillow corpus: hand-built files (testdata/pillow; the WebP ones by Pillow's encoder,
// make_webp.py, as Go has none) and what Pillow made of each (pillow.json, written by
// pillow_sizes.py under Pillow 9.4.0, Debian's python3-pil). Regenerate the Go-built files with
// `go test -run TestPillowCorpus -update ./tokenize/imagesize/`, then pillow.json with
// `python3 testdata/pillow/pillow_sizes.py testdata/pillow > testdata/pillow/pillow.json`.

var update = flag.Bool("update", false, "rewrite the Go-built files of testdata/pillow")

const corpusDir = "testdata/pillow"

// PillowResult is one file of pillow.json.
type PillowResult struct {
	Size       []int  `json:"size"`       // Image.open(...).size
	Transposed []int  `json:"transposed"` // the size after ImageOps.exif_transpose
	Loads      bool   `json:"loads"`      // convert("RGB") succeeds
	Error      string `json:"error"`      // Image.open failed
}

func pngChunk(b *bytes.Buffer, typ string, data []byte) {
	binary.Write(b, binary.BigEndian, uint32(len(data)))
	start := b.Len()
	b.WriteString(typ)
	b.Write(data)
	binary.Write(b, binary.BigEndian, crc32.ChecksumIEEE(b.Bytes()[start:]))
}

func be32(vs ...uint32) []byte {
	var b bytes.Buffer
	for _, v := range vs {
		binary.Write(&b, binary.BigEndian, v)
	}
	return b.Bytes()
}

// zrows is the zlib stream of h rows of n zero bytes, each after filter byte 0.
func zrows(h, n int) []byte {
	var b bytes.Buffer
	z, _ := zlib.NewWriterLevel(&b, zlib.BestCompression)
	row := make([]byte, 1+n)
	for y := 0; y < h; y++ {
		z.Write(row)
	}
	z.Close()
	return b.Bytes()
}

// exifTIFF is a big-endian TIFF header with IFD0 holding one Orientation (0x0112) entry.
func exifTIFF(orientation int) []byte {
	var b bytes.Buffer
	b.WriteString("MM\x00\x2a")
	b.Write(be32(8))
	binary.Write(&b, binary.BigEndian, uint16(1))
	binary.Write(&b, binary.BigEndian, [4]uint16{0x0112, 3, 0, 1}) // tag, SHORT, count 1 (32 bits)
	binary.Write(&b, binary.BigEndian, [2]uint16{uint16(orientation), 0})
	b.Write(be32(0))
	return b.Bytes()
}

// pngFile is a PNG of w×h at the bit depth and colour type given, zero pixels (rowBytes per
// row), with chunks before its IDAT.
func pngFile(w, h, depth, ctype, rowBytes int, before func(*bytes.Buffer)) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	pngChunk(&b, "IHDR", append(be32(uint32(w), uint32(h)), byte(depth), byte(ctype), 0, 0, 0))
	if before != nil {
		before(&b)
	}
	pngChunk(&b, "IDAT", zrows(h, rowBytes))
	pngChunk(&b, "IEND", nil)
	return b.Bytes()
}

// fcTL is an APNG frame control chunk's data.
func fcTL(seq, w, h, x, y uint32) []byte {
	return append(be32(seq, w, h, x, y), 0, 1, 0, 100, 0, 0)
}

// apng is a 64×48 RGB APNG: the default image is the first frame; the second is w×h at x,y.
func apng(w, h, x, y uint32) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	pngChunk(&b, "IHDR", append(be32(64, 48), 8, 2, 0, 0, 0))
	pngChunk(&b, "acTL", be32(2, 0))
	pngChunk(&b, "fcTL", fcTL(0, 64, 48, 0, 0))
	pngChunk(&b, "IDAT", zrows(48, 64*3))
	pngChunk(&b, "fcTL", fcTL(1, w, h, x, y))
	pngChunk(&b, "fdAT", append(be32(2), zrows(int(h), int(w)*3)...))
	pngChunk(&b, "IEND", nil)
	return b.Bytes()
}

// gifFrame is one image descriptor: its place and size.
type gifFrame struct{ x, y, w, h int }

// gifFile is a GIF with a two-colour global table, the bytes of extra before the first frame,
// and each frame's pixels (all colour 0) LZW-coded.
func gifFile(sw, sh int, extra []byte, frames ...gifFrame) []byte {
	var b bytes.Buffer
	b.WriteString("GIF89a")
	binary.Write(&b, binary.LittleEndian, [2]uint16{uint16(sw), uint16(sh)})
	b.Write([]byte{0x80, 0, 0, 0, 0, 0, 255, 255, 255})
	b.Write(extra)
	for _, f := range frames {
		b.WriteByte(',')
		binary.Write(&b, binary.LittleEndian, [4]uint16{uint16(f.x), uint16(f.y), uint16(f.w), uint16(f.h)})
		b.WriteByte(0)
		b.WriteByte(2) // LZW minimum code size
		var data bytes.Buffer
		z := lzw.NewWriter(&data, lzw.LSB, 2)
		z.Write(make([]byte, f.w*f.h))
		z.Close()
		for p := data.Bytes(); len(p) > 0; {
			n := min(len(p), 255)
			b.WriteByte(byte(n))
			b.Write(p[:n])
			p = p[n:]
		}
		b.WriteByte(0)
	}
	b.WriteByte(';')
	return b.Bytes()
}

// issueGIF is issue 39's 35-byte GIF: a 28×28 screen, one 1×1 frame at (3583, 3583).
var issueGIF = []byte("GIF89a\x1c\x00\x1c\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff" +
	",\xff\x0d\xff\x0d\x01\x00\x01\x00\x00" + "\x02\x02\x44\x01\x00" + ";")

// jpegSegment is marker m with its length and data.
func jpegSegment(m byte, data []byte) []byte {
	return append([]byte{0xFF, m, byte((len(data) + 2) >> 8), byte(len(data) + 2)}, data...)
}

// sof0 is a baseline frame header of w×h, three components.
func sof0(w, h int) []byte {
	return jpegSegment(0xC0, []byte{8, byte(h >> 8), byte(h), byte(w >> 8), byte(w), 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1})
}

// splitJPEG cuts a JPEG before its frame header: SOI and tables, the frame header, the rest.
func splitJPEG(t testing.TB, f []byte) (head, frame, rest []byte) {
	i := bytes.Index(f, []byte{0xFF, 0xC0})
	if i < 0 {
		t.Fatal("no SOF0")
	}
	n := int(binary.BigEndian.Uint16(f[i+2:]))
	return f[:i], f[i : i+2+n], f[i+2+n:]
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// goBuilt is every file of the corpus this test writes (the WebP ones come from make_webp.py).
func goBuilt(t testing.TB) map[string][]byte {
	files := map[string][]byte{}
	pal := image.NewPaletted(image.Rect(0, 0, 300, 200), color.Palette{color.Black, color.White, color.Gray{128}})
	var b bytes.Buffer
	if err := png.Encode(&b, pal); err != nil {
		t.Fatal(err)
	}
	files["png_palette_300x200.png"] = bytes.Clone(b.Bytes())
	files["png_rgba_28.png"] = encodePNG(t, 28, 28)
	files["png_1x1.png"] = encodePNG(t, 1, 1)
	files["png_12000x12000_1bit.png"] = pngFile(12000, 12000, 1, 0, 1500, nil)
	files["png_exif_orientation6_90x30.png"] = pngFile(90, 30, 8, 0, 90, func(b *bytes.Buffer) { pngChunk(b, "eXIf", exifTIFF(6)) })
	files["apng_2frames_64x48.png"] = apng(32, 16, 10, 10)
	files["apng_second_frame_outside.png"] = apng(500, 400, 3000, 3000)

	jpg := encodeJPEG(t, 40, 30)
	head, frame, rest := splitJPEG(t, jpg)
	for o := 1; o <= 8; o++ {
		files["jpeg_exif_orientation"+string(rune('0'+o))+"_40x30.jpg"] = cat(jpg[:2], jpegSegment(0xE1, cat([]byte("Exif\x00\x00"), exifTIFF(o))), jpg[2:])
	}
	// An EXIF thumbnail whose own frame header says 4000×3000, inside APP1: skipped with it.
	thumb := cat([]byte{0xFF, 0xD8}, sof0(4000, 3000), []byte{0xFF, 0xD9})
	files["jpeg_exif_thumbnail_40x30.jpg"] = cat(jpg[:2], jpegSegment(0xE1, cat([]byte("Exif\x00\x00"), exifTIFF(1), thumb)), jpg[2:])
	// Junk between segments, a lengthless JPG0 marker and fill bytes, as Pillow skips them.
	files["jpeg_junk_and_jpg0_40x30.jpg"] = cat(head, []byte("junk"), []byte{0xFF, 0xF0, 0xFF, 0xFF}, frame, rest)
	files["jpeg_two_frames_big_first.jpg"] = cat(head, sof0(4000, 3000), frame, rest)
	files["jpeg_two_frames_big_last.jpg"] = cat(head, frame, sof0(4000, 3000), rest)
	// Pillow opens 8-bit samples and 1, 3 or 4 components only.
	bits12 := bytes.Clone(frame)
	bits12[4] = 12
	files["jpeg_12bit_samples.jpg"] = cat(head, bits12, rest)
	comps2 := bytes.Clone(frame)
	comps2[9] = 2
	files["jpeg_2_components.jpg"] = cat(head, comps2, rest)
	files["jpeg_1x1.jpg"] = encodeJPEG(t, 1, 1)
	files["jpeg_28.jpg"] = encodeJPEG(t, 28, 28)
	// Headers only (no pixel data): Pillow opens it at its size and cannot load it.
	files["jpeg_12000x12000_headers.jpg"] = cat([]byte{0xFF, 0xD8}, sof0(12000, 12000), jpegSegment(0xDA, []byte{3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0}), []byte{0xFF, 0xD9})

	files["gif_issue39_35_bytes.gif"] = issueGIF
	files["gif_1x1.gif"] = gifFile(1, 1, nil, gifFrame{0, 0, 1, 1})
	files["gif_28.gif"] = encodeGIF(t, 28, 28)
	files["gif_12000x12000_screen.gif"] = gifFile(12000, 12000, nil, gifFrame{0, 0, 1, 1})
	files["gif_frame_right_of_screen.gif"] = gifFile(28, 28, nil, gifFrame{100, 0, 50, 10})
	files["gif_frame_below_screen.gif"] = gifFile(28, 28, nil, gifFrame{0, 4000, 10, 10})
	files["gif_second_frame_outside.gif"] = gifFile(28, 28, nil, gifFrame{0, 0, 28, 28}, gifFrame{3000, 3000, 5, 5})
	// A comment, a stray byte and a graphic control extension before the frame.
	ext := cat([]byte("!\xfe\x05hello\x00"), []byte{0x00}, []byte("!\xf9\x04\x00\x0a\x00\x00\x00"))
	files["gif_extensions_then_frame_outside.gif"] = gifFile(20, 10, ext, gifFrame{15, 5, 30, 30})
	anim := &gif.GIF{}
	for i := 0; i < 3; i++ {
		anim.Image = append(anim.Image, image.NewPaletted(image.Rect(0, 0, 50, 40), color.Palette{color.Black, color.White}))
		anim.Delay = append(anim.Delay, 5)
	}
	b.Reset()
	if err := gif.EncodeAll(&b, anim); err != nil {
		t.Fatal(err)
	}
	files["gif_animated_50x40.gif"] = bytes.Clone(b.Bytes())
	return files
}

// refusedHere are the corpus files Read refuses (each one Pillow cannot load either).
var refusedHere = map[string]bool{"jpeg_two_frames_big_first.jpg": true, "jpeg_two_frames_big_last.jpg": true,
	"jpeg_12bit_samples.jpg": true, "jpeg_2_components.jpg": true}

func loadPillowJSON(t testing.TB) map[string]PillowResult {
	raw, err := os.ReadFile(filepath.Join(corpusDir, "pillow.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]PillowResult
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPillowCorpus: every file of the corpus is sized exactly as Pillow opened it, or refused
// where Pillow could not load it (then no engine decodes it). The Go-built files are what
// goBuilt makes now (so pillow.json speaks of these bytes).
func TestPillowCorpus(t *testing.T) {
	built := goBuilt(t)
	for name, f := range built {
		path := filepath.Join(corpusDir, name)
		if *update {
			if err := os.WriteFile(path, f, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, f) {
			t.Errorf("%s: the committed file differs from what goBuilt makes (run with -update, then pillow_sizes.py)", name)
		}
	}
	pillow := loadPillowJSON(t)
	names, _ := filepath.Glob(filepath.Join(corpusDir, "*.*"))
	n := 0
	for _, path := range names {
		name := filepath.Base(path)
		if strings.HasSuffix(name, ".py") || strings.HasSuffix(name, ".json") {
			continue
		}
		n++
		p, ok := pillow[name]
		if !ok {
			t.Errorf("%s: not in pillow.json", name)
			continue
		}
		f, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Read(f)
		switch {
		case refusedHere[name]:
			if err == nil {
				t.Errorf("%s: read %+v, want a refusal", name, got)
			}
			if p.Error == "" && p.Loads {
				t.Errorf("%s: refused here, but Pillow loads it", name)
			}
		case err != nil:
			t.Errorf("%s: %v (Pillow: %+v)", name, err, p)
		case p.Error != "":
			// Pillow cannot open it (the engine refuses it): any size is at or above nothing.
		case got.Width != p.Size[0] || got.Height != p.Size[1]:
			t.Errorf("%s: read %d×%d, Pillow opens %v", name, got.Width, got.Height, p.Size)
		}
	}
	if n < 30 {
		t.Fatalf("%d files in the corpus", n)
	}
}

// pillowPython is a python3 that imports PIL, or "".
func pillowPython() string {
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import PIL").Run() == nil {
			return py
		}
	}
	return ""
}

// TestPillowJSONIsPillows re-asks Pillow, where one is installed (Debian: apt-get install
// python3-pil), so pillow.json stays what Pillow says; without one it is skipped and
// TestPillowCorpus rests on the recorded answers.
func TestPillowJSONIsPillows(t *testing.T) {
	py := pillowPython()
	if py == "" {
		t.Skip("no python3 with Pillow")
	}
	out, err := exec.Command(py, filepath.Join(corpusDir, "pillow_sizes.py"), corpusDir).Output()
	if err != nil {
		t.Fatal(err)
	}
	var live map[string]PillowResult
	if err := json.Unmarshal(out, &live); err != nil {
		t.Fatal(err)
	}
	rec := loadPillowJSON(t)
	var names []string
	for k := range live {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		a, b := live[k], rec[k]
		if (a.Error == "") != (b.Error == "") || a.Loads != b.Loads || !equalInts(a.Size, b.Size) || !equalInts(a.Transposed, b.Transposed) {
			t.Errorf("%s: Pillow says %+v, pillow.json %+v", k, a, b)
		}
	}
	if len(live) != len(rec) {
		t.Errorf("Pillow saw %d files, pillow.json has %d", len(live), len(rec))
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
