// Package fairness is the `kvgate-lab fairness` experiment (issue 40): an engine simulator with a
// real KV pool, two heavy tenants flooding it (weights 4 and 1, the weight-4 tenant's traffic all
// into replica 0) and light interactive tenants, through 1, 2 and 4 real kvgate processes that
// share one Redis, under the admission set-ups none (queue off), round_robin and fair. It reports
// what the engine saw (pool-full hits, KV use under overload), what each light tenant saw (TTFT
// against its solo figure, refusals) and how the heavy tenants shared what the light ones left.
//
// It starts kvgate as a process and never imports a gateway package; the simulator runs in this
// process (package enginesim). Results are measured on the wall clock: they vary run to run.
package fairness

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim"
)

// Set-ups, as the report names them.
const (
	SetupNone       = "none"
	SetupRoundRobin = "round_robin"
	SetupFair       = "fair"
)

// Params are the experiment's knobs; every one is echoed in the report.
type Params struct {
	Kvgate   string `json:"-"` // path of the kvgate binary
	RedisURL string `json:"-"`
	Prefix   string `json:"-"` // Redis key prefix for this run

	// HFDir, when set, is a model tokenizer directory both the engine and the gateways use, so
	// the gateways count prompts exactly (tier local) instead of reserving an estimate's bound.
	HFDir string `json:"hf_dir,omitempty"`

	Replicas []int    `json:"replicas"`
	Setups   []string `json:"setups"`

	PoolTokens   int           `json:"pool_tokens"`
	TokenDelay   time.Duration `json:"-"`
	TokenDelayMs float64       `json:"token_delay_ms"`
	PollInterval time.Duration `json:"-"`

	HeavyStreams   int           `json:"heavy_streams"` // per heavy tenant
	HeavyPrompt    int           `json:"heavy_prompt_words"`
	HeavyMaxTokens int           `json:"heavy_max_tokens"`
	LightTenants   int           `json:"light_tenants"`
	LightPrompt    int           `json:"light_prompt_words"`
	LightMaxTokens int           `json:"light_max_tokens"`
	LightThink     time.Duration `json:"-"`

	Warm     time.Duration `json:"-"` // heavy load alone before the window opens
	Window   time.Duration `json:"-"` // what is measured
	Solo     time.Duration `json:"-"` // light tenants alone, per replica count
	WindowS  float64       `json:"window_s"`
	SoloS    float64       `json:"solo_s"`
	Timeout  time.Duration `json:"-"` // queue.timeout
	TimeoutS float64       `json:"queue_timeout_s"`
}

// DefaultParams fit the whole run (3 set-ups × 1, 2, 4 replicas) in under three minutes on two
// cores: a 8,192-token pool that about 15 heavy requests fill, 2 ms per generated token.
func DefaultParams() Params {
	return Params{
		Replicas: []int{1, 2, 4}, Setups: []string{SetupNone, SetupRoundRobin, SetupFair},
		PoolTokens: 8192, TokenDelay: 2 * time.Millisecond, PollInterval: 250 * time.Millisecond,
		HeavyStreams: 16, HeavyPrompt: 200, HeavyMaxTokens: 300,
		LightTenants: 2, LightPrompt: 40, LightMaxTokens: 8, LightThink: 50 * time.Millisecond,
		Warm: 1500 * time.Millisecond, Window: 6 * time.Second, Solo: 3 * time.Second, Timeout: 5 * time.Second,
	}
}

// Short shrinks p to a smoke run (1 and 2 replicas, short windows) for a test of the report's
// shape: well under a minute.
func (p *Params) Short() {
	p.Replicas = []int{1, 2}
	p.Warm, p.Window, p.Solo = 500*time.Millisecond, 1500*time.Millisecond, 700*time.Millisecond
}

// Validate refuses what the experiment cannot run, naming the field.
func (p *Params) Validate() error {
	switch {
	case p.Kvgate == "":
		return fmt.Errorf("kvgate: the path of the kvgate binary is needed")
	case len(p.Replicas) == 0 || slices.ContainsFunc(p.Replicas, func(n int) bool { return n < 1 || n > 16 }):
		return fmt.Errorf("replicas: each from 1 to 16, got %v", p.Replicas)
	case p.PoolTokens < 1024:
		return fmt.Errorf("pool-tokens: at least 1024, got %d", p.PoolTokens)
	case p.HeavyStreams < 1 || p.LightTenants < 1:
		return fmt.Errorf("heavy-streams and light-tenants must be at least 1")
	case p.Window <= 0 || p.Solo <= 0:
		return fmt.Errorf("window and solo must be positive")
	}
	for _, s := range p.Setups {
		if s != SetupNone && s != SetupRoundRobin && s != SetupFair {
			return fmt.Errorf("setups: %q is not none, round_robin or fair", s)
		}
	}
	if !slices.Contains(p.Setups, SetupNone) {
		return fmt.Errorf("setups: none is needed (it is the reference of leftover_share)")
	}
	return nil
}

// Light is one light tenant's figures in one run.
type Light struct {
	Tenant   string `json:"tenant"`
	Requests int    `json:"requests"`
	// Unanswered: requests without a first token when the window closed; their waits so far
	// are in the TTFT percentiles as lower bounds.
	Unanswered   int            `json:"unanswered"`
	TTFTP50      float64        `json:"ttft_p50_ms"`
	TTFTP99      float64        `json:"ttft_p99_ms"`
	SoloTTFTP50  float64        `json:"solo_ttft_p50_ms"`
	SoloTTFTP99  float64        `json:"solo_ttft_p99_ms"`
	Refused      int            `json:"refused"`
	RefusedCodes map[string]int `json:"refused_by_status,omitempty"`
}

// Heavy is what the heavy tenants got.
type Heavy struct {
	// LeftoverShare: the heavy tenants' tokens per second over what the engine delivered per
	// second in the none set-up (same replica count) minus this run's light tokens per second:
	// the share of the capacity the light tenants leave that the heavy ones got.
	LeftoverShare float64 `json:"leftover_share"`
	TokensPerS    float64 `json:"tokens_per_s"`
	Refused       int     `json:"refused"`
}

// Row is one set-up at one replica count.
type Row struct {
	Setup        string `json:"setup"`
	Replicas     int    `json:"replicas"`
	PoolFullHits int    `json:"pool_full_hits"`
	// KVUse is the engine's mean KV use (used / pool) over the window, the heavy tenants backlogged.
	KVUse  float64 `json:"kv_use"`
	Lights []Light `json:"lights"`
	Heavy  Heavy   `json:"heavy"`
	// WeightShare is the delivered token share per weight class among the backlogged (heavy)
	// tenants: "4" is heavy-w4 (all its traffic into replica 0), "1" heavy-w1 (spread). Fair
	// share: 0.8 and 0.2.
	WeightShare map[string]float64 `json:"weight_share"`
	// Jain is Jain's index over the backlogged tenants' token service per weight (1 = exactly
	// weighted-fair, 0.5 = one of two got everything).
	Jain            float64 `json:"jain"`
	TotalTokensPerS float64 `json:"total_tokens_per_s"`
}

// Report is the experiment's output.
type Report struct {
	Params Params `json:"params"`
	Rows   []Row  `json:"rows"`
	Note   string `json:"note"`
}

// Run runs every set-up at every replica count and returns the report. progress, if not nil,
// gets a line per run.
func Run(ctx context.Context, p Params, progress func(string)) (*Report, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	p.TokenDelayMs = float64(p.TokenDelay) / float64(time.Millisecond)
	p.WindowS, p.SoloS, p.TimeoutS = p.Window.Seconds(), p.Solo.Seconds(), p.Timeout.Seconds()
	if progress == nil {
		progress = func(string) {}
	}
	// page size 1, as SGLang's default: the gateway's token reservations are the engine's pages.
	simTokenizer := ""
	if p.HFDir != "" {
		simTokenizer = "hf:" + p.HFDir
	}
	sim, err := enginesim.New(enginesim.Config{PoolTokens: p.PoolTokens, ContextLength: 32768, PageSize: 1,
		TokenDelay: p.TokenDelay, Seed: 1, Tokenizer: simTokenizer})
	if err != nil {
		return nil, err
	}
	if err := sim.Listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	go func() { _ = sim.Serve() }()
	defer sim.Close()
	dir, err := os.MkdirTemp("", "kvgate-fairness-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	maxN := slices.Max(p.Replicas)
	rep := &Report{Params: p, Note: "queue state is per replica (not shared through Redis yet): at 2 and 4 replicas each gateway " +
		"admits against its own reservations and the engine's polled usage, so fair and round_robin there show per-replica behaviour"}
	solo := map[int]map[string][]float64{} // replicas → tenant → TTFTs
	noneRate := map[int]float64{}          // replicas → total tokens/s under none
	setups := append([]string{SetupNone}, slices.DeleteFunc(slices.Clone(p.Setups), func(s string) bool { return s == SetupNone })...)
	for _, setup := range setups {
		gws, err := startGateways(ctx, p, dir, setup, maxN, sim.Addr())
		if err != nil {
			return nil, err
		}
		for _, n := range p.Replicas {
			bases := gws.bases[:n]
			if setup == SetupNone {
				progress(fmt.Sprintf("solo: %d replica(s)", n))
				res := runLoad(ctx, p, bases, sim, false, p.Solo)
				solo[n] = res.ttfts
				if err := waitIdle(ctx, sim); err != nil {
					gws.stop()
					return nil, err
				}
			}
			progress(fmt.Sprintf("%s: %d replica(s)", setup, n))
			res := runLoad(ctx, p, bases, sim, true, p.Window)
			if err := waitIdle(ctx, sim); err != nil {
				gws.stop()
				return nil, err
			}
			if setup == SetupNone {
				noneRate[n] = res.totalRate()
			}
			rep.Rows = append(rep.Rows, res.row(p, setup, n, solo[n], noneRate[n]))
		}
		gws.stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return rep, nil
}

// waitIdle waits until the engine holds nothing: every request of the last run has ended.
func waitIdle(ctx context.Context, sim *enginesim.Server) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := sim.Stats()
		if st.Pool.PagesFree == st.Pool.PagesTotal {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the engine still holds %d of %d pages 30 s after the load stopped", st.Pool.PagesTotal-st.Pool.PagesFree, st.Pool.PagesTotal)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// gateways are one set-up's kvgate processes.
type gateways struct {
	procs []*proc
	bases []string
}

func (g *gateways) stop() {
	for _, p := range g.procs {
		p.stop()
	}
}

// Tenant keys: the key of tenant t is "sk-fair-" + t.
func tenantKey(t string) string { return "sk-fair-" + t }

func lightName(i int) string { return fmt.Sprintf("light-%d", i+1) }

const (
	heavy4 = "heavy-w4"
	heavy1 = "heavy-w1"
)

func startGateways(ctx context.Context, p Params, dir, setup string, n int, sim string) (*gateways, error) {
	queue := "queue: {enabled: false}"
	if setup != SetupNone {
		queue = fmt.Sprintf("queue: {enabled: true, policy: %s, timeout: %s, max_queued: 100000}", setup, p.Timeout)
	}
	var tenants strings.Builder
	tenant := func(name string, weight int) {
		fmt.Fprintf(&tenants, "  - {name: %s, key_sha256: %q, weight: %d}\n", name, sha256Hex(tenantKey(name)), weight)
	}
	tenant(heavy4, 4)
	tenant(heavy1, 1)
	for i := 0; i < p.LightTenants; i++ {
		tenant(lightName(i), 1)
	}
	tokenizer := ""
	if p.HFDir != "" {
		tokenizer = fmt.Sprintf("tokenizer: {hf_dir: %q}", p.HFDir)
	}
	g := &gateways{}
	for i := 0; i < n; i++ {
		addr, err := listenAddr()
		if err != nil {
			return nil, err
		}
		yaml := fmt.Sprintf(`listen: %q
backends: [{name: sim, url: "http://%s", role: unified}]
tenants:
%sstate: {redis_url: %q, key_prefix: %q}
capacity: {poll_interval: %s}
canary: {enabled: false}
upstream: {max_conns: 4096}
server: {drain_delay: 0s, drain_timeout: 0s}
%s
%s
`, addr, sim, tenants.String(), p.RedisURL, p.Prefix+setup+":", p.PollInterval, queue, tokenizer)
		conf := filepath.Join(dir, fmt.Sprintf("%s-%d.yaml", setup, i))
		if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
			g.stop()
			return nil, err
		}
		pr, err := startProc(filepath.Join(dir, fmt.Sprintf("%s-%d.log", setup, i)), p.Kvgate, "serve", "--config", conf)
		if err != nil {
			g.stop()
			return nil, err
		}
		g.procs = append(g.procs, pr)
		g.bases = append(g.bases, "http://"+addr)
	}
	for i, base := range g.bases {
		if err := waitReady(ctx, g.procs[i], base); err != nil {
			g.stop()
			return nil, err
		}
	}
	return g, nil
}

func waitReady(ctx context.Context, pr *proc, base string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvgate at %s not ready after 20 s:\n%s", base, pr.tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-pr.done:
			return fmt.Errorf("kvgate at %s exited:\n%s", base, pr.tail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// percentile of sorted-in-place xs (nearest rank), 0 for none.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// jain is Jain's fairness index of xs: (Σx)² / (n·Σx²); 1 when all are equal.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

func round(x float64, digits int) float64 {
	m := math.Pow(10, float64(digits))
	return math.Round(x*m) / m
}
