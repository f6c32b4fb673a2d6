package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// runSim runs `kvgate sim`: one simulated SGLang server. The first line on
// stdout is "listening on ADDR" (the address actually bound, so --listen
// 127.0.0.1:0 works); in prefill mode a second line names the bootstrap
// address. Logs go to stderr.
func runSim(args []string) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	var cfg enginesim.Config
	listen := fs.String("listen", "127.0.0.1:30000", "address to listen on (port 0 = ephemeral)")
	fs.StringVar(&cfg.Mode, "mode", enginesim.ModeCombined, "combined | prefill | decode")
	fs.IntVar(&cfg.PoolTokens, "pool-tokens", 20480, "KV pool size in tokens (rounded down to a page multiple)")
	fs.IntVar(&cfg.ContextLength, "context-length", 32768, "the model's context length (max_model_len)")
	fs.IntVar(&cfg.BootstrapPort, "bootstrap-port", enginesim.DefaultBootstrapPort,
		"prefill: bootstrap port to bind (0 = ephemeral); decode: port used when a request's bootstrap_port is null")
	fs.IntVar(&cfg.PageSize, "page-size", 1, "tokens per KV page (SGLang's default is 1; some attention backends force 16, 32 or 64)")
	fs.IntVar(&cfg.DPSize, "dp-size", 1, "DP attention ranks, each scheduling in its own pool (requests go round robin)")
	fs.IntVar(&cfg.DPPoolSkew, "dp-pool-skew", 0, "pages fewer in each DP rank's pool than in the previous rank's")
	fs.IntVar(&cfg.ReservedDecodeTokens, "num-reserved-decode-tokens", 512, "decode: a request is preallocated only while prompt + this fits the pool (SGLang's default 512)")
	fs.StringVar(&cfg.Allocator, "allocator", kvmodel.AllocLIFO, "free-page policy: lifo | fifo | random")
	fs.StringVar(&cfg.Tokenizer, "tokenizer", "cl100k", "cl100k | chunk4 | hf:DIR (a model's tokenizer.json + tokenizer_config.json: its own tokens and chat template)")
	fs.StringVar(&cfg.Bug, "bug", kvmodel.BugNone, "admit-rejected | template-drift | salt-ignored | salt-dropped-tier2 | batch-slot-residue | forced-reasoning-end | none")
	fs.BoolVar(&cfg.NoCachedTokens, "no-cached-tokens", false, "report no cached-token figures (meta_info.cached_tokens, usage.prompt_tokens_details), as an engine without --enable-cache-report")
	fs.IntVar(&cfg.ResidueTokens, "residue-tokens", 32, "bug batch-slot-residue: the last sampled tokens a request leaves in its batch slot for the next reply")
	fs.IntVar(&cfg.ThinkBudget, "thinking-budget", 0, "thinking_token_budget of requests that name none (0 = none)")
	fs.StringVar(&cfg.ReasoningEnd, "reasoning-end", "</think>", "the string forced where a thinking budget runs out")
	fs.BoolVar(&cfg.SaltHeader, "salt-header", false, "honour an X-Cache-Salt request header, overriding the body's salt (vllm#57609)")
	fs.IntVar(&cfg.DriftTokens, "drift-tokens", 256, "bug template-drift: tokens the engine's template adds to every text prompt")
	fs.StringVar(&cfg.Fix, "fix", kvmodel.FixNone, "none | reject-at-admission | zero-on-release | ownership-tags | decode-length-check")
	seed := fs.Uint64("seed", 1, "seed of the model and of the random allocator")
	fs.DurationVar(&cfg.TokenDelay, "token-delay", 0, "sleep between generated tokens")
	fs.BoolVar(&cfg.FillContext, "fill-context", false, "OpenAI requests without max_tokens generate until the context is full (SGLang's scheduler), not 16 tokens")
	fs.DurationVar(&cfg.TransferTimeout, "transfer-timeout", 5*time.Second, "decode: how long to wait for a room's KV")
	fs.StringVar(&cfg.Model, "model", "sim", "served model name (any requested name is accepted)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "require Authorization: Bearer KEY on every call")
	fs.BoolVar(&cfg.Fast, "fast", false, "answer generation routes with tiny fixed replies: no prompt parsing, tokenizing or KV pool (for benchmarks)")
	fs.DurationVar(&cfg.FixedDelay, "fixed-delay", 0, "fast mode: sleep before every generation reply (a fixed backend latency)")
	fs.DurationVar(&cfg.EventInterval, "event-interval", 0, "fast mode: sleep before each content event of a stream")
	fs.IntVar(&cfg.FastEvents, "fast-events", 8, "fast mode: content events per stream")
	quiet := fs.Bool("quiet", false, "do not log leaks and aborts on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvgate sim: unexpected arguments %q\n", fs.Args())
		return 2
	}
	cfg.Seed = *seed
	if cfg.ReservedDecodeTokens == 0 {
		cfg.ReservedDecodeTokens = -1 // the Config's "none": its zero value means the default
	}
	if !*quiet {
		cfg.Log = os.Stderr
	}
	srv, err := enginesim.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvgate sim: %v\n", err)
		return 2
	}
	if err := srv.Listen(*listen); err != nil {
		fmt.Fprintf(os.Stderr, "kvgate sim: %v\n", err)
		return 1
	}
	c := srv.Config()
	fmt.Printf("listening on %s\n", srv.Addr())
	if b := srv.BootstrapAddr(); b != "" {
		fmt.Printf("bootstrap listening on %s\n", b)
	}
	fmt.Fprintf(os.Stderr, "kvgate sim: mode=%s pool=%d tokens (%d pages of %d) context=%d max_req_input_len=%d allocator=%s tokenizer=%s bug=%s fix=%s\n",
		c.Mode, c.PoolTokens/c.PageSize*c.PageSize, c.PoolTokens/c.PageSize, c.PageSize, c.ContextLength, srv.MaxReqInputLen(),
		c.Allocator, c.Tokenizer, c.Bug, c.Fix)
	if c.Fast {
		fmt.Fprintf(os.Stderr, "kvgate sim: fast mode: fixed replies, fixed-delay=%v event-interval=%v fast-events=%d\n", c.FixedDelay, c.EventInterval, c.FastEvents)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		_ = srv.Close()
	}()
	if err := srv.Serve(); err != nil {
		fmt.Fprintf(os.Stderr, "kvgate sim: %v\n", err)
		return 1
	}
	return 0
}
