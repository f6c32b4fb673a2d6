// Package imagesize reads an image's width and height as Pillow opens the file (PNG, JPEG,
// WebP, GIF) without decoding a pixel, so a client's image can be counted against the pool
// before any engine sees it: engines' image processors open images with Pillow, and its size,
// not the header a standard decoder reads, is what they resize and count. It reads: a PNG's IHDR
// (CRC checked; an APNG's frames lie inside it), a JPEG's frame header walked to as Pillow walks
// the markers (two frame headers refused), a WebP's VP8, VP8L or VP8X chunk (the canvas), a
// GIF's logical screen grown to cover its first frame. Anything else, a header cut short, or
// dimensions no engine would decode is an error, never a zero size. It is a leaf library: it
// imports nothing of kvgate, so the engine simulator may use it too, and it never allocates in
// proportion to its input.
package imagesize

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
)

// Format names an image file format.
type Format string

const (
	PNG  Format = "png"
	JPEG Format = "jpeg"
	WebP Format = "webp"
	GIF  Format = "gif"
)

// Size is an image's format and its dimensions in pixels as Pillow reports them (Image.size
// after Image.open, what engines resize from). EXIF orientation is not applied: a processor
// that applies it sees Height×Width (counters take the larger of both, request.CountImages).
type Size struct {
	Format        Format
	Width, Height int
}

// MaxPixels is the largest image accepted: twice Pillow's MAX_IMAGE_PIXELS (89,478,485), the
// size above which Pillow refuses to open an image (DecompressionBombError), so no engine
// built on it decodes one.
const MaxPixels = 2 * 89_478_485

// MaxHeaderBytes bounds how far into a file the header is looked for: a JPEG's scan may follow
// large metadata segments (EXIF with a thumbnail, ICC profiles, XMP), each at most 64 KiB, and a
// GIF's first frame may follow its extensions. A file whose size is not settled within it is
// refused.
const MaxHeaderBytes = 1 << 20

var (
	// ErrUnknownFormat: the bytes start like none of the supported formats.
	ErrUnknownFormat = errors.New("not a PNG, JPEG, WebP or GIF image")
	// ErrTruncated: the file ends before its dimensions.
	ErrTruncated = errors.New("the image ends before its header does")
)

// Read returns the size Pillow opens the file at b's start at (b may be only a prefix of the
// file: it needs the headers up to a JPEG's first scan or a GIF's first frame, not the pixels).
func Read(b []byte) (Size, error) {
	var s Size
	var err error
	switch {
	case len(b) >= 8 && string(b[:8]) == "\x89PNG\r\n\x1a\n":
		s, err = readPNG(b)
	case len(b) >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF:
		s, err = readJPEG(b)
	case len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		s, err = readWebP(b)
	case len(b) >= 6 && (string(b[:6]) == "GIF87a" || string(b[:6]) == "GIF89a"):
		s, err = readGIF(b)
	case len(b) < 12:
		return Size{}, ErrTruncated
	default:
		return Size{}, ErrUnknownFormat
	}
	if err != nil {
		return Size{}, err
	}
	if s.Width <= 0 || s.Height <= 0 {
		return Size{}, fmt.Errorf("%s header states %d×%d pixels", s.Format, s.Width, s.Height)
	}
	if int64(s.Width)*int64(s.Height) > MaxPixels {
		return Size{}, fmt.Errorf("%s header states %d×%d pixels, more than %d", s.Format, s.Width, s.Height, MaxPixels)
	}
	return s, nil
}

// readPNG reads the IHDR chunk, which must come first (PNG spec 5.6), and checks its CRC.
func readPNG(b []byte) (Size, error) {
	if len(b) < 33 {
		return Size{}, ErrTruncated
	}
	if binary.BigEndian.Uint32(b[8:12]) != 13 || string(b[12:16]) != "IHDR" {
		return Size{}, errors.New("png: the first chunk is not a 13-byte IHDR")
	}
	if crc32.ChecksumIEEE(b[12:29]) != binary.BigEndian.Uint32(b[29:33]) {
		return Size{}, errors.New("png: IHDR checksum mismatch")
	}
	w, h := binary.BigEndian.Uint32(b[16:20]), binary.BigEndian.Uint32(b[20:24])
	if w > 1<<31-1 || h > 1<<31-1 { // the spec's limit
		return Size{}, errors.New("png: dimension over 2^31-1")
	}
	return Size{Format: PNG, Width: int(w), Height: int(h)}, nil
}

// readJPEG walks the markers as Pillow's JpegImageFile._open does (src/PIL/JpegImagePlugin.py
// at 4e5f09f, lines 369–400) up to the first scan (SOS): bytes between segments that are not
// 0xFF are skipped, 0xFF fill bytes and stuffed 0xFF00 are skipped, SOI, RSTn, EOI, JPG (C8)
// and JPGn (F0–FD) carry no length (MARKER's None handler, lines 276–329: Pillow reads no
// length for them, so neither does this walk), every other marker in its table is skipped by its
// length, and a marker outside the table is an error ("no marker found"). Each frame header
// (SOF0–SOF15 but C4, C8, CC, and DHP DE; its SOF handler, lines 188–199) sets Pillow's size, so
// the last one before the scan wins there; libjpeg refuses a second one (JERR_SOF_DUPLICATE:
// Pillow opens such a file and then fails to load it), so two frame headers are refused here, as
// the engine would refuse them. The EXIF thumbnail inside APP1 is skipped with its segment.
func readJPEG(b []byte) (Size, error) {
	var s Size
	frames := 0
	i := 2
	for {
		for i < len(b) && b[i] != 0xFF {
			i++ // junk between segments (lines 375–377)
		}
		for i < len(b) && b[i] == 0xFF {
			i++ // fill bytes (lines 393–395)
		}
		if i >= len(b) {
			return Size{}, ErrTruncated
		}
		m := b[i]
		i++
		switch {
		case m == 0x00:
			continue // stuffed 0xFF00 (lines 396–397)
		case m == 0xD8 || m == 0xD9 || m >= 0xD0 && m <= 0xD7 || m == 0xC8 || m >= 0xF0 && m <= 0xFD:
			continue // no length in Pillow's table
		case m < 0xC0:
			return Size{}, fmt.Errorf("jpeg: unknown marker FF%02X (Pillow: no marker found)", m)
		}
		if i+2 > len(b) {
			return Size{}, ErrTruncated
		}
		n := int(binary.BigEndian.Uint16(b[i : i+2]))
		if n < 2 {
			return Size{}, fmt.Errorf("jpeg: segment length %d", n)
		}
		isFrame := m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xCC || m == 0xDE
		switch {
		case m == 0xDA: // the scan: Pillow stops here (lines 383–391)
			if frames == 0 {
				return Size{}, errors.New("jpeg: no frame header before the scan data")
			}
			return s, nil
		case isFrame:
			// length, precision, height, width, components (lines 197–217).
			if n < 8 {
				return Size{}, fmt.Errorf("jpeg: frame header length %d", n)
			}
			if i+8 > len(b) {
				return Size{}, ErrTruncated
			}
			if frames++; frames > 1 {
				return Size{}, errors.New("jpeg: a second frame header before the scan (libjpeg refuses the file; Pillow would size it by the last)")
			}
			if b[i+2] != 8 {
				return Size{}, fmt.Errorf("jpeg: %d-bit samples (Pillow opens 8-bit JPEGs only)", b[i+2])
			}
			if c := b[i+7]; c != 1 && c != 3 && c != 4 {
				return Size{}, fmt.Errorf("jpeg: %d components (Pillow opens 1, 3 or 4)", c)
			}
			// Height 0 defers it to a DNL segment after the first scan: Pillow's size is then
			// 0 high and libjpeg refuses it; Read's check refuses it here.
			s = Size{Format: JPEG, Height: int(binary.BigEndian.Uint16(b[i+3 : i+5])), Width: int(binary.BigEndian.Uint16(b[i+5 : i+7]))}
		}
		i += n
	}
}

// readWebP reads the first chunk of a RIFF WEBP file: VP8 (lossy; the key frame's 14-bit
// dimensions), VP8L (lossless; 14-bit dimensions minus one) or VP8X (extended; the 24-bit
// canvas dimensions minus one). Pillow sizes every WebP by libwebp's demuxer, the canvas
// (src/PIL/WebPImagePlugin.py at 4e5f09f, lines 52–59: WebPAnimDecoder(...).get_info()), and
// the demuxer refuses a still image whose frame differs from the canvas and an animation frame
// that leaves it (Pillow 9.4 with libwebp: "could not create decoder object"), so the canvas
// is the size for stills and animations alike.
func readWebP(b []byte) (Size, error) {
	if len(b) < 20 {
		return Size{}, ErrTruncated
	}
	chunk := string(b[12:16])
	size := binary.LittleEndian.Uint32(b[16:20])
	p := b[20:]
	switch chunk {
	case "VP8 ":
		// Frame tag (3 bytes; bit 0 clear on a key frame), start code 9D 01 2A, then width and
		// height, 14 bits each (the top 2 bits are a scale the decoder does not apply).
		if size < 10 {
			return Size{}, fmt.Errorf("webp: VP8 chunk of %d bytes", size)
		}
		if len(p) < 10 {
			return Size{}, ErrTruncated
		}
		if p[0]&1 != 0 {
			return Size{}, errors.New("webp: VP8 bitstream does not start with a key frame")
		}
		if p[3] != 0x9D || p[4] != 0x01 || p[5] != 0x2A {
			return Size{}, errors.New("webp: VP8 start code missing")
		}
		w := int(binary.LittleEndian.Uint16(p[6:8]) & 0x3FFF)
		h := int(binary.LittleEndian.Uint16(p[8:10]) & 0x3FFF)
		return Size{Format: WebP, Width: w, Height: h}, nil
	case "VP8L":
		if size < 5 {
			return Size{}, fmt.Errorf("webp: VP8L chunk of %d bytes", size)
		}
		if len(p) < 5 {
			return Size{}, ErrTruncated
		}
		if p[0] != 0x2F {
			return Size{}, errors.New("webp: VP8L signature missing")
		}
		bits := binary.LittleEndian.Uint32(p[1:5])
		if bits>>29 != 0 {
			return Size{}, errors.New("webp: VP8L version is not 0")
		}
		w := int(bits&0x3FFF) + 1
		h := int(bits>>14&0x3FFF) + 1
		return Size{Format: WebP, Width: w, Height: h}, nil
	case "VP8X":
		if size < 10 {
			return Size{}, fmt.Errorf("webp: VP8X chunk of %d bytes", size)
		}
		if len(p) < 10 {
			return Size{}, ErrTruncated
		}
		w := int(uint32(p[4])|uint32(p[5])<<8|uint32(p[6])<<16) + 1
		h := int(uint32(p[7])|uint32(p[8])<<8|uint32(p[9])<<16) + 1
		return Size{Format: WebP, Width: w, Height: h}, nil
	}
	return Size{}, fmt.Errorf("webp: unknown first chunk %q", chunk)
}

// readGIF sizes a GIF as Pillow opens it (src/PIL/GifImagePlugin.py at 4e5f09f): the logical
// screen (line 111), then the first frame read by _seek(0) (lines 204–303): extensions are
// skipped sub-block by sub-block, any other byte before an image descriptor is skipped, and the
// first image descriptor grows the size to cover the frame, max(screen, left + width) by
// max(screen, top + height) (lines 282–286). A 28×28 screen holding a 1×1 frame at
// (3583, 3583) is 3584×3584 to Pillow and to every processor that opens images with it. A
// trailer or the end of the file before any frame is an error: Pillow cannot open the file
// ("image not found in GIF frame"). Later frames are not read: an image processor decodes the
// first (Pillow grows the size again only on seeking to a frame).
func readGIF(b []byte) (Size, error) {
	if len(b) < 13 {
		return Size{}, ErrTruncated
	}
	w := int(binary.LittleEndian.Uint16(b[6:8]))
	h := int(binary.LittleEndian.Uint16(b[8:10]))
	i := 13
	if flags := b[10]; flags&0x80 != 0 {
		i += 3 << (flags&7 + 1) // the global colour table (lines 115–119)
	}
	for {
		if i >= len(b) {
			return Size{}, ErrTruncated
		}
		c := b[i]
		i++
		switch c {
		case ';':
			return Size{}, errors.New("gif: the trailer comes before any image (Pillow cannot open it)")
		case '!':
			// An extension: its label, then data sub-blocks up to an empty one (lines 221–273).
			i++
			for {
				if i >= len(b) {
					return Size{}, ErrTruncated
				}
				n := int(b[i])
				i += 1 + n
				if n == 0 {
					break
				}
			}
		case ',':
			if i+9 > len(b) {
				return Size{}, ErrTruncated
			}
			x1 := int(binary.LittleEndian.Uint16(b[i:i+2])) + int(binary.LittleEndian.Uint16(b[i+4:i+6]))
			y1 := int(binary.LittleEndian.Uint16(b[i+2:i+4])) + int(binary.LittleEndian.Uint16(b[i+6:i+8]))
			return Size{Format: GIF, Width: max(w, x1), Height: max(h, y1)}, nil
		}
		// Any other byte is skipped (line 304: s = b"" and the loop reads on).
	}
}

// ReadBase64 decodes base64 text (standard alphabet, padding optional, line breaks ignored as
// Python's decoder ignores them) just far enough to read the image's header, then checks that
// the rest decodes too, without keeping it: memory stays bounded whatever the length, and text
// that is not base64 is an error, as it would be for the engine.
func ReadBase64(data string) (Size, error) {
	data = strings.TrimRight(data, "=\r\n")
	dec := base64.NewDecoder(base64.RawStdEncoding, strings.NewReader(data))
	var buf [4096]byte
	head := make([]byte, 0, 64)
	var size Size
	found := false
	for {
		n, err := dec.Read(buf[:])
		if !found && len(head) < MaxHeaderBytes {
			head = append(head, buf[:min(n, MaxHeaderBytes-len(head))]...)
			s, rerr := Read(head)
			switch {
			case rerr == nil:
				size, found = s, true
			case !errors.Is(rerr, ErrTruncated):
				return Size{}, rerr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return Size{}, fmt.Errorf("base64: %v", err)
		}
		if !found && len(head) >= MaxHeaderBytes {
			return Size{}, fmt.Errorf("no image dimensions in the first %d bytes", MaxHeaderBytes)
		}
	}
	if !found {
		if len(head) == 0 {
			return Size{}, errors.New("the image is empty")
		}
		return Size{}, ErrTruncated
	}
	return size, nil
}
