package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/lab/leaklab"
)

// runLeaklab runs `kvgate leaklab`: the leak experiments in process.
// Results go to stdout (JSON with --json, else aligned tables); progress and
// timing go to stderr only, so the JSON is identical for identical flags.
func runLeaklab(args []string) int {
	fs := flag.NewFlagSet("leaklab", flag.ContinueOnError)
	p := leaklab.DefaultParams()
	exp := fs.String("experiment", "all", "warmup | warm | allocators | fixes | all (the four) | advisories (a live gateway: not in all)")
	ap := leaklab.DefaultAdvisoryParams()
	fs.IntVar(&ap.Requests, "requests", ap.Requests, "advisories: requests per row")
	fs.IntVar(&ap.Tenants, "advisory-tenants", ap.Tenants, "advisories: tenants sending them")
	fs.IntVar(&ap.Concurrency, "concurrency", ap.Concurrency, "advisories: requests in flight")
	fs.IntVar(&ap.MaxTokens, "max-tokens", ap.MaxTokens, "advisories: output tokens asked of each request")
	residues := fs.String("residues", joinInts(ap.Residues), "advisories: batch-slot-residue's residue lengths (tokens), one row each")
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	svgDir := fs.String("svg", "", "write one SVG plot per experiment into this directory")
	fs.Uint64Var(&p.Seed, "seed", p.Seed, "seed; each trial's seed derives from (seed, experiment, row, trial)")
	fs.IntVar(&p.PoolPages, "pool-pages", p.PoolPages, "decode pool size in pages")
	fs.IntVar(&p.PageSize, "page-size", p.PageSize, "tokens per page")
	fs.IntVar(&p.Tenants, "tenants", p.Tenants, "tenants of the background requests")
	fs.Float64Var(&p.PromptMedian, "prompt-median", p.PromptMedian, "median background prompt length (tokens, log-normal)")
	fs.Float64Var(&p.PromptSigma, "prompt-sigma", p.PromptSigma, "sigma of the log-normal prompt length")
	fs.Float64Var(&p.ArrivalProb, "arrival-prob", p.ArrivalProb, "probability that a background request arrives in a step")
	fs.StringVar(&p.HoldDist, "hold-dist", p.HoldDist, "hold-time distribution: uniform | exponential")
	fs.Float64Var(&p.HoldMean, "hold-mean", p.HoldMean, "mean hold time in steps")
	fs.IntVar(&p.OversizedTokens, "oversized-tokens", p.OversizedTokens, "length of the oversized prompt")
	fs.IntVar(&p.PrefillPoolTokens, "prefill-pool-tokens", p.PrefillPoolTokens, "prefill pool size in tokens")
	fs.IntVar(&p.ContextLength, "context-length", p.ContextLength, "model context length")
	fs.StringVar(&p.Allocator, "allocator", p.Allocator, "allocator of warmup, warm and fixes: lifo | fifo | random")
	fs.StringVar(&p.Bug, "bug", p.Bug, "admit-rejected | none")
	fs.IntVar(&p.WarmSteps, "warm-steps", p.WarmSteps, "warm-up length of warm, allocators and fixes")
	warmups := fs.String("warmup-steps", joinInts(p.WarmupSteps), "comma-separated warm-up lengths of the warmup experiment")
	fs.IntVar(&p.TrialsWarmup, "trials-warmup", p.TrialsWarmup, "trials per warm-up length")
	fs.IntVar(&p.TrialsWarm, "trials-warm", p.TrialsWarm, "trials of the warm experiment")
	fs.IntVar(&p.TrialsAllocators, "trials-allocators", p.TrialsAllocators, "trials per allocator")
	fs.IntVar(&p.TrialsFixes, "trials-fixes", p.TrialsFixes, "trials per fix")
	fs.IntVar(&p.Workers, "workers", 0, "parallel trials (0 = number of CPUs); does not change results")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if p.WarmupSteps, err = parseInts(*warmups); err != nil {
		fmt.Fprintf(os.Stderr, "kvgate leaklab: --warmup-steps: %v\n", err)
		return 2
	}
	if err := p.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "kvgate leaklab: %v\n", err)
		return 2
	}
	if *exp == leaklab.ExperimentAdvisories {
		if ap.Residues, err = parseInts(*residues); err != nil {
			fmt.Fprintf(os.Stderr, "kvgate leaklab: --residues: %v\n", err)
			return 2
		}
		ap.Seed = p.Seed
		return runAdvisories(ap, *asJSON)
	}
	names := []string{*exp}
	if *exp == "all" {
		names = leaklab.Experiments
	}
	var reports []*leaklab.Report
	for _, name := range names {
		start := time.Now()
		last := time.Time{}
		rep, err := p.Run(name, func(e string, done, total int) {
			if time.Since(last) > time.Second || done == total {
				last = time.Now()
				fmt.Fprintf(os.Stderr, "leaklab %s: %d/%d trials\n", e, done, total)
			}
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvgate leaklab: %v\n", err)
			return 2
		}
		fmt.Fprintf(os.Stderr, "leaklab %s: done in %v\n", name, time.Since(start).Round(time.Millisecond))
		reports = append(reports, rep)
		if *svgDir != "" {
			path, err := leaklab.WriteSVG(*svgDir, rep)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kvgate leaklab: writing plot: %v\n", err)
				return 1
			}
			fmt.Fprintf(os.Stderr, "leaklab %s: plot %s\n", name, path)
		}
	}
	if !*asJSON {
		for _, r := range reports {
			leaklab.WriteTable(os.Stdout, r)
		}
		return 0
	}
	var doc any = reports[0]
	if *exp == "all" {
		doc = map[string]any{"experiments": reports}
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(doc); err != nil {
		fmt.Fprintf(os.Stderr, "kvgate leaklab: %v\n", err)
		return 1
	}
	return 0
}

// runAdvisories runs the advisories experiment: one row per bug variant, each against a fresh
// engine and gateway.
func runAdvisories(ap leaklab.AdvisoryParams, asJSON bool) int {
	start := time.Now()
	rep, err := ap.RunAdvisories(func(e string, done, total int) {
		fmt.Fprintf(os.Stderr, "leaklab %s: %d/%d rows\n", e, done, total)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvgate leaklab: %v\n", err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "leaklab %s: done in %v\n", rep.Experiment, time.Since(start).Round(time.Millisecond))
	if !asJSON {
		leaklab.WriteTable(os.Stdout, rep)
		return 0
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintf(os.Stderr, "kvgate leaklab: %v\n", err)
		return 1
	}
	return 0
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a non-negative integer", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no warm-up lengths")
	}
	return out, nil
}
