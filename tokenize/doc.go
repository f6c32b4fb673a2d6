// Package tokenize counts prompt tokens for kvgate's admission check.
//
// It owns the encoders (built once per library and encoding, then shared), the ChatML rendering
// that both kvgate and the simulator count, the byte bound (tier 1 of DESIGN.md's "Counting
// tokens"), the early-exit and parallel chunked estimate (tier 2) and the safety ratio used when
// the exact count is not available (tier 3's fallback).
//
// It must never reach the network: both libraries (kvgate's own counter, the default, and
// tiktoken-go's) read the vocabularies github.com/tiktoken-go/tokenizer compiles in. It must
// not change counts through its own splitting: chunks are cut only where both cl100k_base's and
// o200k_base's pre-tokenizers would cut anyway (so the sum equals the whole-text count), except
// inside runs with no such boundary for 64 KiB, where a cut shifts the count by about one token,
// upwards in practice. It takes no admission decision: callers compare the counts
// it returns with limits, and the byte bound, not these estimates, is what is sound.
package tokenize
