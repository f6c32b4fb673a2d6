// Package leaklab runs the leak experiments of ../shared/leaklab.md in
// process, on the same Pool and allocator code as the HTTP simulator
// (lab/enginesim/kvmodel), at page granularity and without HTTP. It owns the
// experiments' model and their JSON/SVG reports; results are a pure function
// of the parameters and the seed (each trial's seed is derived from
// (seed, experiment, row, trial)), so parallel runs print identical output.
// It must never put timing or host facts into results, and never import a
// gateway package.
package leaklab

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// Params are the model's parameters; every choice the published analysis
// left open is here, with a default, and is echoed in the JSON.
type Params struct {
	Seed              uint64  `json:"seed"`
	PoolPages         int     `json:"pool_pages"`
	PageSize          int     `json:"page_size"`
	Tenants           int     `json:"tenants"`
	PromptMedian      float64 `json:"prompt_median_tokens"`
	PromptSigma       float64 `json:"prompt_sigma"`
	ArrivalProb       float64 `json:"arrival_prob_per_step"`
	HoldDist          string  `json:"hold_dist"`       // uniform | exponential
	HoldMean          float64 `json:"hold_mean_steps"` // mean hold time in steps
	OversizedTokens   int     `json:"oversized_tokens"`
	PrefillPoolTokens int     `json:"prefill_pool_tokens"`
	ContextLength     int     `json:"context_length"`
	Allocator         string  `json:"allocator"` // used by warmup, warm and fixes
	Bug               string  `json:"bug"`       // admit-rejected | none
	WarmSteps         int     `json:"warm_steps"`
	WarmupSteps       []int   `json:"warmup_steps"`
	TrialsWarmup      int     `json:"trials_warmup"`
	TrialsWarm        int     `json:"trials_warm"`
	TrialsAllocators  int     `json:"trials_allocators"`
	TrialsFixes       int     `json:"trials_fixes"`
	Workers           int     `json:"-"` // parallelism; does not change results
}

// DefaultParams are the published mechanism's numbers plus our choices for
// what it left open: one arrival every other step and uniform hold times of
// mean 160 steps keep the pool about half full (mean prompt ≈ 13,200 tokens
// ≈ 206 pages; 0.5 × 206 × 160 ≈ 16,500 of 32,768 pages).
func DefaultParams() Params {
	return Params{
		Seed: 1, PoolPages: 32768, PageSize: 64, Tenants: 200,
		PromptMedian: 8000, PromptSigma: 1.0, ArrivalProb: 0.5,
		HoldDist: "uniform", HoldMean: 160,
		OversizedTokens: 800000, PrefillPoolTokens: 681280, ContextLength: 1 << 20,
		Allocator: kvmodel.AllocLIFO, Bug: kvmodel.BugAdmitRejected,
		WarmSteps:    1000,
		WarmupSteps:  []int{0, 10, 30, 100, 300, 1000, 3000},
		TrialsWarmup: 30, TrialsWarm: 100, TrialsAllocators: 30, TrialsFixes: 100,
	}
}

// Validate refuses parameters the model cannot run, naming the field.
func (p *Params) Validate() error {
	switch {
	case p.PoolPages <= 0 || p.PageSize <= 0:
		return fmt.Errorf("pool-pages and page-size must be positive")
	case p.Tenants <= 0:
		return fmt.Errorf("tenants must be positive")
	case p.PromptMedian < 1 || p.PromptSigma < 0:
		return fmt.Errorf("prompt-median must be ≥ 1 and prompt-sigma ≥ 0")
	case p.ArrivalProb < 0 || p.ArrivalProb > 1:
		return fmt.Errorf("arrival-prob must be in [0, 1]")
	case p.HoldDist != "uniform" && p.HoldDist != "exponential":
		return fmt.Errorf("hold-dist: %q is not uniform or exponential", p.HoldDist)
	case p.HoldMean < 1:
		return fmt.Errorf("hold-mean must be at least 1 step")
	case p.OversizedTokens <= 0 || p.PrefillPoolTokens <= 0:
		return fmt.Errorf("oversized-tokens and prefill-pool-tokens must be positive")
	case p.Bug != kvmodel.BugAdmitRejected && p.Bug != kvmodel.BugNone:
		return fmt.Errorf("bug: %q is not admit-rejected or none", p.Bug)
	case p.OversizedTokens >= p.ContextLength:
		return fmt.Errorf("oversized-tokens: %d is not below context-length %d (outside the leak window)", p.OversizedTokens, p.ContextLength)
	case p.OversizedTokens < kvmodel.MaxReqInputLen(p.PrefillPoolTokens, p.PageSize, p.ContextLength):
		return fmt.Errorf("oversized-tokens: %d fits the prefill pool (max_req_input_len %d): nothing to study",
			p.OversizedTokens, kvmodel.MaxReqInputLen(p.PrefillPoolTokens, p.PageSize, p.ContextLength))
	case p.WarmSteps < 0:
		return fmt.Errorf("warm-steps must not be negative")
	}
	switch p.Allocator {
	case kvmodel.AllocLIFO, kvmodel.AllocFIFO, kvmodel.AllocRandom:
	default:
		return fmt.Errorf("allocator: %q is not lifo, fifo or random", p.Allocator)
	}
	if (p.OversizedTokens+p.PageSize-1)/p.PageSize > p.PoolPages {
		return fmt.Errorf("oversized-tokens: %d tokens do not fit a decode pool of %d pages", p.OversizedTokens, p.PoolPages)
	}
	return nil
}

// Fixes in the order the fixes experiment reports them.
var Fixes = []string{kvmodel.FixNone, kvmodel.FixRejectAtAdmission, kvmodel.FixZeroOnRelease,
	kvmodel.FixOwnershipTags, kvmodel.FixDecodeLengthCheck}

// Allocators in the order the allocators experiment reports them.
var Allocators = []string{kvmodel.AllocLIFO, kvmodel.AllocFIFO, kvmodel.AllocRandom}

// trialSpec is one simulated server's life.
type trialSpec struct {
	seed      uint64
	warmSteps int
	allocator string
	fix       string
}

// TrialResult is what one trial observed.
type TrialResult struct {
	Trial        int      `json:"trial"`
	Status       int      `json:"status"`
	PagesRead    int      `json:"pages_read"`
	ForeignShare float64  `json:"foreign_share"` // foreign pages / pages read (0 when nothing reached the client)
	Tenants      int      `json:"tenants"`       // distinct tenants whose pages were read
	Utilisation  float64  `json:"utilisation"`   // pool pages in use when the oversized request arrived
	leaked       bool     // any page read was written by another request
	detected     bool     // a page read still holds another tenant's marker
	neverShare   float64  // pages read never written / pages read
	sourceAge    *float64 // median over source requests of completions since they finished
}

type held struct {
	id    uint64
	pages []int32
}

// runTrial warms a fresh decode pool, then sends the oversized request.
func (p *Params) runTrial(ts trialSpec) TrialResult {
	rng := rand.New(rand.NewPCG(ts.seed, ts.seed^0x2545f4914f6cdd1d))
	pool, err := kvmodel.NewPool(p.PoolPages*p.PageSize, p.PageSize, ts.allocator, ts.seed, false)
	if err != nil {
		panic(err) // parameters were validated
	}
	pool.ZeroOnRelease = ts.fix == kvmodel.FixZeroOnRelease
	maxPromptTokens := p.PoolPages * p.PageSize
	releases := map[int][]held{}
	finishedAt := map[uint64]int{} // request id → completion count when it finished
	completions := 0
	var nextID uint64
	release := func(step int) {
		for _, h := range releases[step] {
			pool.Release(h.pages)
			completions++
			finishedAt[h.id] = completions
		}
		delete(releases, step)
	}
	mu := math.Log(p.PromptMedian)
	var buf []int32
	for step := 0; step < ts.warmSteps; step++ {
		release(step)
		if rng.Float64() >= p.ArrivalProb {
			continue
		}
		tokens := int(math.Round(math.Exp(mu + p.PromptSigma*rng.NormFloat64())))
		tokens = min(max(tokens, 1), maxPromptTokens)
		tenant := int32(rng.IntN(p.Tenants))
		hold := p.holdSteps(rng)
		n := (tokens + p.PageSize - 1) / p.PageSize
		pages, ok := pool.Alloc(n, buf[:0])
		if !ok {
			continue // a full pool turns the arrival away
		}
		nextID++
		for i, pg := range pages {
			pool.Tags[pg] = kvmodel.PageTag{Writer: nextID, Tenant: tenant, Marker: i == 0}
		}
		releases[step+hold] = append(releases[step+hold], held{id: nextID, pages: append([]int32(nil), pages...)})
		buf = pages
	}
	res := TrialResult{Utilisation: round6(float64(pool.NumPages-pool.Free()) / float64(pool.NumPages))}

	// The oversized request: prefill's pool check fails. With the bug the
	// rejection is parked and a one-token stub is admitted; without it (or
	// with reject-at-admission) the client gets SGLang's 400.
	if p.Bug != kvmodel.BugAdmitRejected || ts.fix == kvmodel.FixRejectAtAdmission {
		res.Status = 400
		return res
	}
	if ts.fix == kvmodel.FixDecodeLengthCheck {
		// One token arrived for an 800,000-token prompt.
		res.Status = 400
		return res
	}
	// Decode reserves pages for the full prompt length; when the pool is
	// too full it waits in its prealloc queue while running requests finish.
	need := (p.OversizedTokens + p.PageSize - 1) / p.PageSize
	step := ts.warmSteps
	for pool.Free() < need {
		release(step)
		step++
	}
	pages, _ := pool.Alloc(need, nil)
	self := nextID + 1
	// Prefill sent a single page (the stub's); decode writes it.
	pool.Tags[pages[0]] = kvmodel.PageTag{Writer: self, Tenant: -2}
	res.PagesRead = len(pages)
	foreign, never := 0, 0
	tenants := map[int32]bool{}
	sources := map[uint64]bool{}
	for _, pg := range pages {
		tag := pool.Tags[pg]
		switch {
		case tag.Writer == self:
		case tag.Writer == 0:
			never++
		default:
			foreign++
			tenants[tag.Tenant] = true
			sources[tag.Writer] = true
			if tag.Marker {
				res.detected = true
			}
		}
	}
	res.leaked = foreign > 0
	res.neverShare = round6(float64(never) / float64(len(pages)))
	if len(sources) > 0 {
		ages := make([]float64, 0, len(sources))
		for id := range sources {
			ages = append(ages, float64(completions-finishedAt[id]))
		}
		res.sourceAge = median(ages)
	}
	if ts.fix == kvmodel.FixOwnershipTags && (foreign > 0 || never > 0) {
		// The read of a slot the request does not own fails the request:
		// nothing reaches the client.
		res.Status = 500
		res.detected = false
		return res
	}
	res.Status = 200
	res.ForeignShare = round6(float64(foreign) / float64(len(pages)))
	res.Tenants = len(tenants)
	return res
}

func (p *Params) holdSteps(rng *rand.Rand) int {
	if p.HoldDist == "exponential" {
		return 1 + int(rng.ExpFloat64()*(p.HoldMean-1))
	}
	// Uniform on [1, 2·mean−1]: mean is HoldMean.
	hi := max(int(2*p.HoldMean)-1, 1)
	return 1 + rng.IntN(hi)
}

// trialSeed derives a trial's seed from (seed, experiment, row, trial).
func trialSeed(seed uint64, experiment string, row, trial int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d/%d", seed, experiment, row, trial)
	return splitmix(h.Sum64())
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// runTrials runs specs on Workers goroutines; results keep the specs' order.
func (p *Params) runTrials(specs []trialSpec, progress func(done, total int)) []TrialResult {
	out := make([]TrialResult, len(specs))
	workers := p.Workers
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	var next, done int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(specs) {
					return
				}
				r := p.runTrial(specs[i])
				out[i] = r
				mu.Lock()
				done++
				d := done
				mu.Unlock()
				if progress != nil {
					progress(d, len(specs))
				}
			}
		}()
	}
	wg.Wait()
	for i := range out {
		out[i].Trial = i
	}
	return out
}

func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }

// median of xs, or nil for an empty set (printed as JSON null).
func median(xs []float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	m = round6(m)
	return &m
}

// Stat is a min/median/max summary; all nil over an empty set.
type Stat struct {
	Min    *float64 `json:"min"`
	Median *float64 `json:"median"`
	Max    *float64 `json:"max"`
}

func summarize(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	lo, hi = round6(lo), round6(hi)
	return Stat{Min: &lo, Median: median(xs), Max: &hi}
}

// String prints min/median/max for tables.
func (s Stat) String() string {
	return fmt.Sprintf("{min %s median %s max %s}", fmtp(s.Min), fmtp(s.Median), fmtp(s.Max))
}
