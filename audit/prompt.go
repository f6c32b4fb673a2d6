package audit

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"strings"
)

// fillerUnit is the text prompts are made of: " the" is one token in every common BPE
// vocabulary (cl100k, o200k, Llama 3, Qwen 2) and "▁the" in SentencePiece ones, so without a
// /tokenize it is also the estimate: one token per unit.
const fillerUnit = " the"

// defaultFillerID is the token id of --native prompts when the target has no /tokenize to give
// the id of fillerUnit: any id below every common vocabulary's size (32,000 and up) is valid.
const defaultFillerID = 1000

// Sizing methods, as the report names them.
const (
	SizingTokenize = "tokenize"  // text, counted by the target's /tokenize: exact
	SizingInputIDs = "input_ids" // --native: token ids, whose count is their length: exact
	SizingEstimate = "estimate"  // text at one token per fillerUnit: an estimate
)

// prompt is one prompt and its size.
type prompt struct {
	text   string
	ids    []int
	tokens int  // the count, or the estimate when !exact
	exact  bool // tokens is the target's count (or the length of ids)
	bound  bool // tokens is an upper bound (the byte length), not an estimate
}

// sizer builds prompts of a requested size.
type sizer struct {
	method string
	// count returns the target's tokenization of text; set when method is SizingTokenize and,
	// for warm-up text, whenever the target has a /tokenize.
	count    func(ctx context.Context, text string) ([]int, error)
	fillerID int
}

// filler returns a prompt of n tokens. With /tokenize it converges on n by counting (a few
// round trips: tokens per unit are measured, not assumed); the count it returns is exact even
// when n itself cannot be hit, and verdicts are judged on that count.
func (s *sizer) filler(ctx context.Context, n int) (prompt, error) {
	switch s.method {
	case SizingInputIDs:
		ids := make([]int, n)
		for i := range ids {
			ids[i] = s.fillerID
		}
		return prompt{ids: ids, tokens: n, exact: true}, nil
	case SizingEstimate:
		return prompt{text: strings.Repeat(fillerUnit, n), tokens: n}, nil
	}
	k := n
	var best prompt
	bestDist := math.MaxInt
	for iter := 0; iter < 6; iter++ {
		text := strings.Repeat(fillerUnit, k)
		ids, err := s.count(ctx, text)
		if err != nil {
			return prompt{}, fmt.Errorf("counting a %d-unit prompt: %w", k, err)
		}
		c := len(ids)
		if d := abs(c - n); d < bestDist {
			best, bestDist = prompt{text: text, tokens: c, exact: true}, d
		}
		if c == n || c == 0 {
			break
		}
		per := float64(c) / float64(k)
		next := k + int(math.Round(float64(n-c)/per))
		if next == k {
			next = k + sign(n-c)
		}
		k = max(next, 1)
	}
	return best, nil
}

// warm returns a prompt of at most n tokens made only of marker, so that every page it fills
// carries the marker. With /tokenize the size is counted; without, it is bounded by the byte
// length (no tokenizer emits more than one token per byte), so it is never larger than n.
func (s *sizer) warm(ctx context.Context, marker string, n int) (prompt, error) {
	unit := " " + marker
	if s.count == nil {
		k := max(n/len(unit), 1)
		text := strings.Repeat(unit, k)
		return prompt{text: text, tokens: len(text), bound: true}, nil
	}
	ids, err := s.count(ctx, strings.Repeat(unit, 8))
	if err != nil {
		return prompt{}, fmt.Errorf("counting warm-up text: %w", err)
	}
	per := max((len(ids)+7)/8, 1)
	for k := max(n/per, 1); ; k = k * 9 / 10 {
		text := strings.Repeat(unit, k)
		ids, err := s.count(ctx, text)
		if err != nil {
			return prompt{}, fmt.Errorf("counting warm-up text: %w", err)
		}
		if len(ids) <= n || k <= 1 {
			return prompt{text: text, tokens: len(ids), exact: true}, nil
		}
	}
}

// markerPrefix starts every warm-up marker. It is not kvgate's reserved "KVG-", so a gateway's
// own canary scanner neither strips nor redacts it: the audit sees what the engine wrote.
const markerPrefix = "kvaudit-"

// markerLen is the number of base32 characters after the prefix (80 random bits).
const markerLen = 16

// minFragment is the shortest quoted piece of a marker that counts as a leak: models quote
// fragments, and 8 random base32 characters (40 bits) do not occur by chance.
const minFragment = 8

const base32Lower = "abcdefghijklmnopqrstuvwxyz234567"

func newMarker() string {
	var b [markerLen]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = base32Lower[b[i]&31]
	}
	return markerPrefix + string(b[:])
}

// findMarkers returns the markers of known (in first-seen order) that text quotes whole, or as
// a fragment of at least minFragment characters after the prefix.
func findMarkers(text string, known []string) []string {
	var found []string
	seen := map[string]bool{}
	for rest := text; ; {
		i := strings.Index(rest, markerPrefix)
		if i < 0 {
			return found
		}
		rest = rest[i+len(markerPrefix):]
		j := 0
		for j < len(rest) && j < markerLen && strings.IndexByte(base32Lower, rest[j]) >= 0 {
			j++
		}
		if j < minFragment {
			continue
		}
		frag := markerPrefix + rest[:j]
		for _, m := range known {
			if strings.HasPrefix(m, frag) && !seen[m] {
				seen[m] = true
				found = append(found, m)
			}
		}
	}
}

// excerpt returns up to 60 bytes of text either side of the first occurrence of marker.
func excerpt(text, marker string) string {
	i := strings.Index(text, marker[:len(markerPrefix)+minFragment])
	if i < 0 {
		return ""
	}
	lo, hi := max(i-60, 0), min(i+len(marker)+60, len(text))
	return text[lo:hi]
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}
