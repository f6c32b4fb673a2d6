package tokenize

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Encoder counts tokens. Implementations are safe for concurrent use.
type Encoder interface {
	// Name says which library and encoding count, e.g. "tiktoken-go/cl100k_base".
	Name() string
	// Count returns the token count of text. When the count is <= stopAfter, or stopAfter < 0, n is
	// the full count and complete is true. Otherwise counting stops as soon as the running count
	// passes stopAfter, and n is some value > stopAfter with complete false.
	//
	// Invalid UTF-8 is counted as if each bad sequence were U+FFFD (what a JSON decoder hands an
	// engine). The count is the sum over pieces cut at pre-token boundaries, which equals the
	// whole-text count; runs without any boundary longer than the encoder's maximum run are cut
	// anyway, which can shift the sum by about one token per cut (upwards in practice).
	Count(text string, stopAfter int) (n int, complete bool)
}

// Decoder is implemented by the encoders NewEncoder returns: it turns token ids of the local
// vocabulary back into text (the gateway's best effort at reading a token-id prompt when the
// engine cannot detokenize it).
type Decoder interface {
	// Decode returns the text of ids, or false when some id is not in the vocabulary.
	Decode(ids []int) (string, bool)
}

// Library and encoding names accepted by NewEncoder (LibraryKvgate, the default, is in kvgate.go).
const (
	LibraryTiktokenGo = "tiktoken-go" // github.com/tiktoken-go/tokenizer's own Count
	EncodingCl100k    = "cl100k_base" // default
	EncodingO200k     = "o200k_base"
)

// chunkTarget is the size of the chunks counted in parallel: large enough that per-chunk overhead
// is noise, small enough that a 1 MB prompt spreads over every core.
const chunkTarget = 64 << 10

// NewEncoder returns the encoder for library and encoding ("" selects the defaults, kvgate and
// cl100k_base: the same counts as tiktoken-go, about 5-15 times faster, BENCHMARKS.md). Vocabularies are built once per process and shared, so calling it again is
// cheap. Unknown names give an error naming the value and the allowed ones.
func NewEncoder(library, encoding string) (Encoder, error) {
	if encoding == "" {
		encoding = EncodingCl100k
	}
	if encoding != EncodingCl100k && encoding != EncodingO200k {
		return nil, fmt.Errorf("tokenize: unknown encoding %q (allowed: %q, %q)", encoding, EncodingCl100k, EncodingO200k)
	}
	switch library {
	case "", LibraryKvgate:
		return kvgateEncoder(encoding)
	case LibraryTiktokenGo:
		return tiktokenGoEncoder(encoding)
	default:
		return nil, fmt.Errorf("tokenize: unknown tokenizer library %q (allowed: %q, %q)", library, LibraryKvgate, LibraryTiktokenGo)
	}
}

// chunked is tiktoken-go's counting engine: it cuts text into chunks (counted in
// parallel) and each chunk into pieces (the unit of early exit), then sums piece counts.
type chunked struct {
	name string
	// pieceTarget is the size a piece aims for; maxRun the longest piece cut when a run has no
	// safe boundary.
	pieceTarget, maxRun int
	countPiece          func(string) int
	decode              func([]int) (string, bool)
}

func (c *chunked) Name() string { return c.name }

func (c *chunked) Decode(ids []int) (string, bool) {
	if c.decode == nil {
		return "", false
	}
	return c.decode(ids)
}

func (c *chunked) Count(text string, stopAfter int) (int, bool) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	if text == "" {
		return 0, true
	}
	limit := int64(stopAfter)
	if stopAfter < 0 {
		limit = math.MaxInt64
	}
	// Chunk ends depend only on the text, never on the number of workers, so the same text always
	// gives the same count whatever GOMAXPROCS is.
	var ends []int
	for start := 0; start < len(text); {
		end := nextCut(text, start, chunkTarget, chunkTarget)
		ends = append(ends, end)
		start = end
	}
	var (
		total   atomic.Int64
		stopped atomic.Bool
		next    atomic.Int64
	)
	work := func() {
		for !stopped.Load() {
			k := int(next.Add(1) - 1)
			if k >= len(ends) {
				return
			}
			start := 0
			if k > 0 {
				start = ends[k-1]
			}
			chunk := text[start:ends[k]]
			for p := 0; p < len(chunk); {
				e := nextCut(chunk, p, c.pieceTarget, c.maxRun)
				if total.Add(int64(c.countPiece(chunk[p:e]))) > limit {
					stopped.Store(true)
					return
				}
				if stopped.Load() {
					return // another worker passed the limit: our remaining pieces cannot matter
				}
				p = e
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(ends))
	if workers <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(work)
		}
		wg.Wait()
	}
	// stopped is set only after total passed limit, and total never decreases.
	return int(total.Load()), !stopped.Load()
}
