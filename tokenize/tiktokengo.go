package tokenize

import (
	"sync"

	"github.com/tiktoken-go/tokenizer"
)

// tiktoken-go/tokenizer is linear on adversarial input (its merge switches to a heap for long
// pieces), so its pieces can be long; 16 KiB keeps early exit within ~5k tokens of the limit.
const (
	tiktokenGoPieceTarget = 16 << 10
	tiktokenGoMaxRun      = chunkTarget
)

var tiktokenGoCodecs sync.Map // encoding name -> *onceCodec

type onceCodec struct {
	once  sync.Once
	codec tokenizer.Codec
	err   error
}

// tiktokenGoEncoder returns the shared encoder for encoding, building the codec on first use
// (its vocabulary is compiled into the binary: no file, no network).
func tiktokenGoEncoder(encoding string) (Encoder, error) {
	v, _ := tiktokenGoCodecs.LoadOrStore(encoding, &onceCodec{})
	oc := v.(*onceCodec)
	oc.once.Do(func() { oc.codec, oc.err = tokenizer.Get(tokenizer.Encoding(encoding)) })
	if oc.err != nil {
		return nil, oc.err
	}
	codec := oc.codec
	return &chunked{
		name:        LibraryTiktokenGo + "/" + encoding,
		pieceTarget: tiktokenGoPieceTarget,
		maxRun:      tiktokenGoMaxRun,
		countPiece: func(s string) int {
			// Count only fails in ErrorModeStrict, which we never set; text is valid UTF-8 here.
			n, err := codec.Count(s)
			if err != nil {
				return len(s)
			}
			return n
		},
		decode: func(ids []int) (string, bool) {
			u := make([]uint, len(ids))
			for i, id := range ids {
				if id < 0 {
					return "", false
				}
				u[i] = uint(id)
			}
			s, err := codec.Decode(u)
			return s, err == nil
		},
	}, nil
}
