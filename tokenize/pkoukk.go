package tokenize

import (
	"fmt"
	"strings"
	"sync"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// pkoukk's byte-pair merge is quadratic in a pre-token's length (97 s on 400 KB of "a", see
// field-notes.md; a profile of 1 MB of "." cut at 1 KiB still spent 68% of its time in
// bytePairMerge), and its scan for special tokens is quadratic in their number per call. So it
// gets pieces of 256 bytes: ordinary text is cut at pre-token boundaries (exact), runs with no
// boundary for 256 bytes are cut anyway (over-estimating by about a token per cut). Measured on
// 1 MB: 256-byte pieces were as fast as or faster than 512, 1024 and 2048 on mixed text, and
// 1.6-3x faster on special-token text.
const pkoukkPieceSize = 256

var (
	// pkoukk keeps its loader in a package variable; set it once, before any encoding is built,
	// so it never downloads a vocabulary.
	pkoukkLoaderOnce sync.Once
	pkoukkEncodings  sync.Map // encoding name -> *oncePkoukk
)

type oncePkoukk struct {
	once sync.Once
	tk   *tiktoken.Tiktoken
	err  error
}

func pkoukkEncoder(encoding string) (Encoder, error) {
	pkoukkLoaderOnce.Do(func() { tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader()) })
	v, _ := pkoukkEncodings.LoadOrStore(encoding, &oncePkoukk{})
	op := v.(*oncePkoukk)
	op.once.Do(func() {
		op.tk, op.err = tiktoken.GetEncoding(encoding)
		if op.err != nil {
			op.err = fmt.Errorf("tokenize: building pkoukk %s offline: %w", encoding, op.err)
		}
	})
	if op.err != nil {
		return nil, op.err
	}
	tk := op.tk
	return &chunked{
		name:        LibraryPkoukk + "/" + encoding,
		pieceTarget: pkoukkPieceSize,
		maxRun:      pkoukkPieceSize,
		countPiece:  func(s string) int { return pkoukkCount(tk, s) },
		decode:      func(ids []int) (string, bool) { return pkoukkDecode(tk, ids) },
	}, nil
}

// pkoukkDecode decodes token by token: the library silently drops ids it does not know.
func pkoukkDecode(tk *tiktoken.Tiktoken, ids []int) (s string, ok bool) {
	defer func() {
		if recover() != nil {
			s, ok = "", false
		}
	}()
	var b strings.Builder
	for _, id := range ids {
		t := tk.Decode([]int{id})
		if t == "" {
			return "", false
		}
		b.WriteString(t)
	}
	return b.String(), true
}

// pkoukkCount counts s with no special token allowed and none disallowed, so special-token text
// such as "<|endoftext|>" is encoded as ordinary text (Encode with disallowed "all" panics on it).
// Should the library panic anyway, the piece is counted by its byte bound: an over-estimate,
// never an under-estimate.
func pkoukkCount(tk *tiktoken.Tiktoken, s string) (n int) {
	defer func() {
		if recover() != nil {
			n = ByteBound(s)
		}
	}()
	return len(tk.Encode(s, nil, nil))
}
