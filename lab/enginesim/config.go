package enginesim

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// Modes, as /server_info's disaggregation_mode reports them.
const (
	ModeCombined = "combined" // reported as "null", as a unified SGLang server does
	ModePrefill  = "prefill"
	ModeDecode   = "decode"
)

// DefaultBootstrapPort is SGLang's default disaggregation bootstrap port.
const DefaultBootstrapPort = 8998

// Config is one simulated server. Zero values are filled by Defaults.
type Config struct {
	Mode          string // combined | prefill | decode; default combined
	PoolTokens    int    // KV pool size in tokens, rounded down to a page multiple; default 20480
	ContextLength int    // the model's context length (max_model_len); default 32768
	PageSize      int    // tokens per page; default 1, SGLang's own
	// DPSize is the number of DP attention ranks (SGLang's --dp-size with --enable-dp-attention):
	// each rank schedules in its own pool of PoolTokens, less DPPoolSkew pages per rank after the
	// first (ranks profile their own memory). Default 1.
	DPSize     int
	DPPoolSkew int
	// ReservedDecodeTokens is num_reserved_decode_tokens: a decode server preallocates a request
	// only while prompt + this fits its pool. Default 512, SGLang's; -1 means 0.
	ReservedDecodeTokens int
	// BootstrapPort: prefill binds it (0 = ephemeral; -1 = unset, which
	// means DefaultBootstrapPort); decode uses it when a request's
	// bootstrap_port is null.
	BootstrapPort int
	Allocator     string        // lifo | fifo | random; default lifo
	Tokenizer     string        // cl100k | chunk4 | hf:DIR; default cl100k
	Bug           string        // none | admit-rejected | template-drift; default none
	Fix           string        // see the Fix constants; default none
	Seed          uint64        // seeds the model and the random allocator
	TokenDelay    time.Duration // sleep between generated tokens; default 0
	// FillContext: an OpenAI request that names no max_tokens generates until the context is
	// full, as SGLang's scheduler does (context − prompt − 1 tokens), instead of
	// wire.DefaultOpenAIMaxTokens.
	FillContext     bool
	TransferTimeout time.Duration // how long decode waits for a room's KV; default 5 s
	Model           string        // served model name; any requested name is accepted; default "sim"
	APIKey          string        // when set, every call needs "Authorization: Bearer KEY"
	// RoomTTL bounds how long prefill keeps an unpulled room (and its pages).
	// Default: 2 × TransferTimeout, at least 10 s.
	RoomTTL time.Duration
	Log     io.Writer // request and error log lines; nil = discard
	// DriftTokens (bug template-drift) is how many tokens the engine's template adds before
	// every text prompt. Default 256.
	DriftTokens int

	// NoCachedTokens leaves the cached-token figures out of every reply (meta_info.cached_tokens,
	// usage.prompt_tokens_details): an engine without SGLang's --enable-cache-report.
	NoCachedTokens bool
	// SaltHeader honours an X-Cache-Salt request header, which overrides the body's salt
	// (vllm#57609); without it the header is ignored, as engines without that change do.
	SaltHeader bool

	// ResidueTokens (bug batch-slot-residue) is how many of its last sampled tokens a request
	// leaves in its batch slot for the next occupant's reply. Default 32.
	ResidueTokens int
	// ThinkBudget is the thinking_token_budget of requests that name none (0 = none): a
	// deployment's default reasoning budget.
	ThinkBudget int
	// ReasoningEnd is the string forced at a thinking budget's end (vLLM's reasoning_end_str).
	// Default "</think>".
	ReasoningEnd string

	// Fast answers the generation routes with a tiny fixed reply, without parsing the prompt,
	// tokenizing or touching the KV pool: a backend that costs almost nothing, so a benchmark
	// measures what sits in front of it (fast.go).
	Fast bool
	// FixedDelay (fast mode) is slept before every generation reply: a backend with a fixed
	// latency. Default 0.
	FixedDelay time.Duration
	// EventInterval (fast mode) is slept before each content event of a stream. Default 0.
	EventInterval time.Duration
	// FastEvents (fast mode) is how many content events a stream carries. Default 8.
	FastEvents int
}

// Defaults fills zero fields with the documented defaults.
func (c *Config) Defaults() {
	if c.Mode == "" {
		c.Mode = ModeCombined
	}
	if c.PoolTokens == 0 {
		c.PoolTokens = 20480
	}
	if c.ContextLength == 0 {
		c.ContextLength = 32768
	}
	if c.PageSize == 0 {
		c.PageSize = 1
	}
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	switch c.ReservedDecodeTokens {
	case 0:
		c.ReservedDecodeTokens = 512
	case -1:
		c.ReservedDecodeTokens = 0
	}
	if c.BootstrapPort < 0 {
		c.BootstrapPort = DefaultBootstrapPort
	}
	if c.Allocator == "" {
		c.Allocator = kvmodel.AllocLIFO
	}
	if c.Tokenizer == "" {
		c.Tokenizer = "cl100k"
	}
	if c.Bug == "" {
		c.Bug = kvmodel.BugNone
	}
	if c.Fix == "" {
		c.Fix = kvmodel.FixNone
	}
	if c.DriftTokens == 0 {
		c.DriftTokens = 256
	}
	if c.TransferTimeout == 0 {
		c.TransferTimeout = 5 * time.Second
	}
	if c.Model == "" {
		c.Model = "sim"
	}
	if c.RoomTTL == 0 {
		c.RoomTTL = max(2*c.TransferTimeout, 10*time.Second)
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.FastEvents == 0 {
		c.FastEvents = 8
	}
	if c.ResidueTokens == 0 {
		c.ResidueTokens = 32
	}
	if c.ReasoningEnd == "" {
		c.ReasoningEnd = "</think>"
	}
}

// Validate refuses a configuration that cannot run, naming the field.
func (c *Config) Validate() error {
	switch c.Mode {
	case ModeCombined, ModePrefill, ModeDecode:
	default:
		return fmt.Errorf("mode: %q is not combined, prefill or decode", c.Mode)
	}
	if c.PageSize <= 0 {
		return fmt.Errorf("page-size: must be positive, got %d", c.PageSize)
	}
	if c.PoolTokens < c.PageSize {
		return fmt.Errorf("pool-tokens: %d holds no page of %d tokens", c.PoolTokens, c.PageSize)
	}
	if c.ReservedDecodeTokens < 0 {
		return fmt.Errorf("num-reserved-decode-tokens: must not be negative, got %d", c.ReservedDecodeTokens)
	}
	if c.DPSize < 1 || c.DPSize > 64 {
		return fmt.Errorf("dp-size: must be 1 to 64, got %d", c.DPSize)
	}
	if c.DPPoolSkew < 0 || c.PoolTokens/c.PageSize-(c.DPSize-1)*c.DPPoolSkew < 2 {
		return fmt.Errorf("dp-pool-skew: %d pages less per rank leaves rank %d fewer than 2 pages", c.DPPoolSkew, c.DPSize-1)
	}
	if c.ContextLength < 8 {
		return fmt.Errorf("context-length: must be at least 8, got %d", c.ContextLength)
	}
	if c.BootstrapPort > 65535 {
		return fmt.Errorf("bootstrap-port: %d is not a port", c.BootstrapPort)
	}
	switch c.Allocator {
	case kvmodel.AllocLIFO, kvmodel.AllocFIFO, kvmodel.AllocRandom:
	default:
		return fmt.Errorf("allocator: %q is not lifo, fifo or random", c.Allocator)
	}
	switch {
	case c.Tokenizer == "cl100k", c.Tokenizer == "chunk4":
	case strings.HasPrefix(c.Tokenizer, "hf:") && len(c.Tokenizer) > 3:
	default:
		return fmt.Errorf("tokenizer: %q is not cl100k, chunk4 or hf:DIR", c.Tokenizer)
	}
	switch c.Bug {
	case kvmodel.BugNone, kvmodel.BugAdmitRejected, kvmodel.BugTemplateDrift, kvmodel.BugSaltIgnored,
		kvmodel.BugSaltDroppedTier2, kvmodel.BugBatchSlotResidue, kvmodel.BugForcedReasoningEnd:
	default:
		return fmt.Errorf("bug: %q is not none, admit-rejected, template-drift, salt-ignored, salt-dropped-tier2, "+
			"batch-slot-residue or forced-reasoning-end", c.Bug)
	}
	if c.ResidueTokens < 0 || c.ThinkBudget < 0 {
		return fmt.Errorf("residue-tokens and thinking-budget must not be negative")
	}
	if c.DriftTokens < 0 {
		return fmt.Errorf("drift-tokens must not be negative")
	}
	switch c.Fix {
	case kvmodel.FixNone, kvmodel.FixRejectAtAdmission, kvmodel.FixZeroOnRelease, kvmodel.FixOwnershipTags, kvmodel.FixDecodeLengthCheck:
	default:
		return fmt.Errorf("fix: %q is not none, reject-at-admission, zero-on-release, ownership-tags or decode-length-check", c.Fix)
	}
	if c.TokenDelay < 0 || c.TransferTimeout < 0 {
		return fmt.Errorf("token-delay and transfer-timeout must not be negative")
	}
	if c.FixedDelay < 0 || c.EventInterval < 0 || c.FastEvents < 0 {
		return fmt.Errorf("fixed-delay, event-interval and fast-events must not be negative")
	}
	return nil
}
