// Package reply turns what an engine sends into what the client gets, and nothing else: content
// encodings undone (or refused), one charset (UTF-8), event streams parsed, every value decoded
// once (duplicate keys refused), scanned for other tenants' canary markers as the client will
// assemble it, and re-serialised from the scanned value; whole replies under one memory budget.
// It knows nothing of HTTP servers or of the exchange: tests and fuzzers drive it with bytes.
package reply

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file normalises what an engine sends into the one form the scanner reads and the client
// receives: content encodings decoded (or refused), one charset (UTF-8), JSON re-serialised from
// the decoded value. The engine is untrusted: nothing it sends reaches the client except what was
// decoded and scanned, so a client cannot decode anything the scanner did not see.

// ErrUnsupportedEncoding is a Content-Encoding the gateway cannot decode: the reply is refused.
var ErrUnsupportedEncoding = errors.New("unsupported content encoding")

// ErrCharset is a charset the gateway does not transcode.
var ErrCharset = errors.New("unsupported charset")

// Decoded is a reply body r with its Content-Encoding (the header's value) undone: gzip,
// deflate, layered in the order given. Anything else (br, zstd, compress) is refused rather than
// passed unread.
func Decoded(contentEncoding string, r io.Reader) (io.Reader, error) {
	enc := strings.TrimSpace(contentEncoding)
	if enc == "" {
		return r, nil
	}
	codings := strings.Split(enc, ",")
	if len(codings) > 2 {
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedEncoding, enc)
	}
	// The last coding applied is listed last: undo them from the end.
	for i := len(codings) - 1; i >= 0; i-- {
		switch c := strings.ToLower(strings.TrimSpace(codings[i])); c {
		case "identity", "":
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(r)
			if err != nil {
				return nil, fmt.Errorf("gzip: %w", err)
			}
			r = zr
		case "deflate":
			r = deflateReader(r)
		default:
			return nil, fmt.Errorf("%w: %q", ErrUnsupportedEncoding, c)
		}
	}
	return r, nil
}

// deflateReader reads HTTP "deflate": zlib-wrapped per RFC 9110, though some servers send raw
// DEFLATE; the first two bytes tell which (a zlib header is a multiple of 31).
func deflateReader(r io.Reader) io.Reader {
	var head [2]byte
	n, _ := io.ReadFull(r, head[:])
	all := io.MultiReader(bytes.NewReader(head[:n]), r)
	if n == 2 && head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
		if zr, err := zlib.NewReader(all); err == nil {
			return zr
		}
	}
	return flate.NewReader(all)
}

// CharsetOf is the charset parameter of a Content-Type, lower case ("" when absent).
func CharsetOf(contentType []byte) string {
	_, params, err := mime.ParseMediaType(string(contentType))
	if err != nil {
		return ""
	}
	return strings.ToLower(params["charset"])
}

// ToUTF8 transcodes a JSON body to UTF-8 the way Python's json.loads reads bytes (the parser
// real clients and SGLang use): a BOM or the pattern of zero bytes in the first four says
// UTF-32 or UTF-16, a UTF-8 BOM is dropped; a declared charset is honoured when there is no BOM.
func ToUTF8(b []byte, charset string) ([]byte, error) {
	enc := ""
	switch {
	case bytes.HasPrefix(b, []byte("\xEF\xBB\xBF")):
		return b[3:], nil
	case bytes.HasPrefix(b, []byte{0, 0, 0xFE, 0xFF}):
		enc, b = "utf-32be", b[4:]
	case bytes.HasPrefix(b, []byte{0xFF, 0xFE, 0, 0}):
		enc, b = "utf-32le", b[4:]
	case bytes.HasPrefix(b, []byte{0xFE, 0xFF}):
		enc, b = "utf-16be", b[2:]
	case bytes.HasPrefix(b, []byte{0xFF, 0xFE}):
		enc, b = "utf-16le", b[2:]
	case len(b) >= 4 && b[0] == 0 && b[1] == 0:
		enc = "utf-32be"
	case len(b) >= 4 && b[0] == 0:
		enc = "utf-16be"
	case len(b) >= 4 && b[1] == 0 && b[2] == 0 && b[3] == 0:
		enc = "utf-32le"
	case len(b) >= 2 && b[1] == 0:
		enc = "utf-16le"
	default:
		switch charset {
		case "", "utf-8", "utf8", "us-ascii", "ascii":
			return b, nil
		case "utf-16", "utf-16le", "utf-16be", "utf-32", "utf-32le", "utf-32be":
			enc = charset
			if enc == "utf-16" {
				enc = "utf-16be" // no BOM: big-endian (RFC 2781)
			} else if enc == "utf-32" {
				enc = "utf-32be"
			}
		case "iso-8859-1", "latin1", "latin-1":
			out := make([]byte, 0, 2*len(b))
			for _, c := range b {
				out = utf8.AppendRune(out, rune(c))
			}
			return out, nil
		default:
			return nil, fmt.Errorf("%w: %q", ErrCharset, charset)
		}
	}
	// Sized once (UTF-16 code units become at most 3 bytes each, UTF-32 at most 4 per 4), as
	// TranscodedLen charges.
	out := make([]byte, 0, len(b)*3/2+4)
	switch enc {
	case "utf-16le", "utf-16be":
		if len(b)%2 != 0 {
			return nil, fmt.Errorf("%s body of odd length", enc)
		}
		u := make([]uint16, len(b)/2)
		for i := range u {
			if enc == "utf-16le" {
				u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
			} else {
				u[i] = uint16(b[2*i])<<8 | uint16(b[2*i+1])
			}
		}
		for _, r := range utf16.Decode(u) {
			out = utf8.AppendRune(out, r)
		}
	default:
		if len(b)%4 != 0 {
			return nil, fmt.Errorf("%s body of bad length", enc)
		}
		for i := 0; i < len(b); i += 4 {
			var r rune
			if enc == "utf-32le" {
				r = rune(b[i]) | rune(b[i+1])<<8 | rune(b[i+2])<<16 | rune(b[i+3])<<24
			} else {
				r = rune(b[i])<<24 | rune(b[i+1])<<16 | rune(b[i+2])<<8 | rune(b[i+3])
			}
			out = utf8.AppendRune(out, r)
		}
	}
	return out, nil
}

// TranscodedLen bounds what toUTF8 allocates for b: nothing for UTF-8 (the common case), at
// most three times b's size otherwise.
func TranscodedLen(b []byte, charset string) int {
	if len(b) >= 2 && (b[0] == 0 || b[1] == 0 || b[0] == 0xFE || b[0] == 0xFF) {
		return 3 * len(b)
	}
	switch charset {
	case "", "utf-8", "utf8", "us-ascii", "ascii":
		return 0
	}
	return 3 * len(b)
}

// errDuplicateKey: an object of the reply names a key twice. Parsers disagree on which value
// wins, so such a reply is refused (after its shadowed values were scanned for the record).
var errDuplicateKey = errors.New("duplicate key in a JSON object")

// maxDepth bounds nesting, so a hostile reply cannot exhaust the stack.
const maxDepth = 256
