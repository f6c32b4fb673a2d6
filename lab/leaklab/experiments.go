package leaklab

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// Experiments in the order `all` runs them.
var Experiments = []string{"warmup", "warm", "allocators", "fixes"}

// Report is one experiment's JSON document. Only the fields of its kind are
// set.
type Report struct {
	Experiment string         `json:"experiment"`
	Params     map[string]any `json:"params"`
	Rows       []any          `json:"rows,omitempty"`
	Summary    *WarmSummary   `json:"summary,omitempty"`
	Trials     []TrialResult  `json:"trials,omitempty"`
}

// WarmupRow is one warm-up length of the warmup experiment.
type WarmupRow struct {
	WarmupSteps int     `json:"warmup_steps"`
	Trials      int     `json:"trials"`
	LeakRate    float64 `json:"leak_rate"`
	DetectRate  float64 `json:"detect_rate"`
}

// WarmSummary summarizes the warm experiment.
type WarmSummary struct {
	Status200    int  `json:"status_200"`
	ForeignShare Stat `json:"foreign_share"`
	Tenants      Stat `json:"tenants"`
}

// AllocatorRow is one allocator of the allocators experiment.
type AllocatorRow struct {
	Allocator               string   `json:"allocator"`
	Trials                  int      `json:"trials"`
	TenantsMedian           *float64 `json:"tenants_median"`
	NeverWrittenShareMedian *float64 `json:"never_written_share_median"`
	SourceAgeMedian         *float64 `json:"source_age_median"`
}

// FixRow is one engine fix of the fixes experiment.
type FixRow struct {
	Fix                string         `json:"fix"`
	Trials             int            `json:"trials"`
	Status200          int            `json:"status_200"`
	Statuses           map[string]int `json:"statuses"`
	ForeignShareMedian *float64       `json:"foreign_share_median"`
}

// Progress receives coarse progress (for stderr); nil is fine.
type Progress func(experiment string, done, total int)

func (p *Params) common() map[string]any {
	return map[string]any{
		"seed": p.Seed, "pool_pages": p.PoolPages, "page_size": p.PageSize, "tenants": p.Tenants,
		"prompt_median_tokens": p.PromptMedian, "prompt_sigma": p.PromptSigma,
		"arrival_prob_per_step": p.ArrivalProb, "hold_dist": p.HoldDist, "hold_mean_steps": p.HoldMean,
		"oversized_tokens": p.OversizedTokens, "prefill_pool_tokens": p.PrefillPoolTokens,
		"prefill_max_req_input_len": kvmodel.MaxReqInputLen(p.PrefillPoolTokens, p.PageSize, p.ContextLength),
		"context_length":            p.ContextLength, "bug": p.Bug,
	}
}

func utilStat(rs []TrialResult) Stat {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = r.Utilisation
	}
	return summarize(xs)
}

// Run runs one experiment by name.
func (p *Params) Run(name string, progress Progress) (*Report, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	prog := func(done, total int) {
		if progress != nil {
			progress(name, done, total)
		}
	}
	params := p.common()
	rep := &Report{Experiment: name, Params: params}
	switch name {
	case "warmup":
		var specs []trialSpec
		for row, w := range p.WarmupSteps {
			for t := 0; t < p.TrialsWarmup; t++ {
				specs = append(specs, trialSpec{seed: trialSeed(p.Seed, name, row, t), warmSteps: w, allocator: p.Allocator, fix: kvmodel.FixNone})
			}
		}
		rs := p.runTrials(specs, prog)
		params["allocator"], params["warmup_steps"], params["trials"] = p.Allocator, p.WarmupSteps, p.TrialsWarmup
		params["utilisation_at_injection"] = utilStat(rs)
		for row, w := range p.WarmupSteps {
			part := rs[row*p.TrialsWarmup : (row+1)*p.TrialsWarmup]
			leaks, det := 0, 0
			for _, r := range part {
				if r.leaked && r.Status == 200 {
					leaks++
				}
				if r.detected && r.Status == 200 {
					det++
				}
			}
			rate := func(n int) float64 {
				if len(part) == 0 {
					return 0
				}
				return round6(float64(n) / float64(len(part)))
			}
			rep.Rows = append(rep.Rows, WarmupRow{WarmupSteps: w, Trials: len(part), LeakRate: rate(leaks), DetectRate: rate(det)})
		}
	case "warm":
		rs := p.warmTrials(name, 0, p.Allocator, kvmodel.FixNone, p.TrialsWarm, prog)
		params["allocator"], params["warm_steps"], params["trials"], params["fix"] = p.Allocator, p.WarmSteps, p.TrialsWarm, kvmodel.FixNone
		params["utilisation_at_injection"] = utilStat(rs)
		var shares, tenants []float64
		sum := &WarmSummary{}
		for _, r := range rs {
			if r.Status == 200 {
				sum.Status200++
			}
			shares = append(shares, r.ForeignShare)
			tenants = append(tenants, float64(r.Tenants))
		}
		sum.ForeignShare, sum.Tenants = summarize(shares), summarize(tenants)
		rep.Summary, rep.Trials = sum, rs
		if rep.Trials == nil {
			rep.Trials = []TrialResult{}
		}
	case "allocators":
		params["warm_steps"], params["trials"], params["allocators"] = p.WarmSteps, p.TrialsAllocators, Allocators
		util := map[string]Stat{}
		for row, a := range Allocators {
			rs := p.warmTrials(name, row, a, kvmodel.FixNone, p.TrialsAllocators, prog)
			util[a] = utilStat(rs)
			var ten, never, age []float64
			for _, r := range rs {
				if r.Status != 200 {
					continue
				}
				ten = append(ten, float64(r.Tenants))
				never = append(never, r.neverShare)
				if r.sourceAge != nil {
					age = append(age, *r.sourceAge)
				}
			}
			rep.Rows = append(rep.Rows, AllocatorRow{Allocator: a, Trials: len(rs), TenantsMedian: median(ten),
				NeverWrittenShareMedian: median(never), SourceAgeMedian: median(age)})
		}
		params["utilisation_at_injection"] = util
	case "fixes":
		params["allocator"], params["warm_steps"], params["trials"], params["fixes"] = p.Allocator, p.WarmSteps, p.TrialsFixes, Fixes
		util := map[string]Stat{}
		defer func() { params["utilisation_at_injection"] = util }()
		for row, f := range Fixes {
			rs := p.warmTrials(name, row, p.Allocator, f, p.TrialsFixes, prog)
			util[f] = utilStat(rs)
			fr := FixRow{Fix: f, Trials: len(rs), Statuses: map[string]int{}}
			var shares []float64
			for _, r := range rs {
				fr.Statuses[strconv.Itoa(r.Status)]++
				if r.Status == 200 {
					fr.Status200++
				}
				shares = append(shares, r.ForeignShare)
			}
			fr.ForeignShareMedian = median(shares)
			rep.Rows = append(rep.Rows, fr)
		}
	default:
		return nil, fmt.Errorf("unknown experiment %q (want warmup, warm, allocators, fixes or all)", name)
	}
	if rep.Rows == nil && rep.Summary == nil {
		rep.Rows = []any{}
	}
	return rep, nil
}

func (p *Params) warmTrials(exp string, row int, alloc, fix string, n int, prog func(int, int)) []TrialResult {
	specs := make([]trialSpec, n)
	for t := range specs {
		specs[t] = trialSpec{seed: trialSeed(p.Seed, exp, row, t), warmSteps: p.WarmSteps, allocator: alloc, fix: fix}
	}
	return p.runTrials(specs, prog)
}

func fmtp(x *float64) string {
	if x == nil {
		return "-"
	}
	return strconv.FormatFloat(*x, 'f', 4, 64)
}

// WriteTable prints a report as an aligned table.
func WriteTable(w io.Writer, r *Report) {
	fmt.Fprintf(w, "experiment %s\n", r.Experiment)
	keys := make([]string, 0, len(r.Params))
	for k := range r.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var ps []string
	for _, k := range keys {
		ps = append(ps, fmt.Sprintf("%s=%v", k, r.Params[k]))
	}
	fmt.Fprintf(w, "params: %s\n", strings.Join(ps, " "))
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	switch r.Experiment {
	case "warmup":
		fmt.Fprintln(tw, "warmup_steps\ttrials\tleak_rate\tdetect_rate\t")
		for _, x := range r.Rows {
			row := x.(WarmupRow)
			fmt.Fprintf(tw, "%d\t%d\t%.3f\t%.3f\t\n", row.WarmupSteps, row.Trials, row.LeakRate, row.DetectRate)
		}
	case "warm":
		s := r.Summary
		fmt.Fprintln(tw, "\tmin\tmedian\tmax\t")
		fmt.Fprintf(tw, "foreign_share\t%s\t%s\t%s\t\n", fmtp(s.ForeignShare.Min), fmtp(s.ForeignShare.Median), fmtp(s.ForeignShare.Max))
		fmt.Fprintf(tw, "tenants\t%s\t%s\t%s\t\n", fmtp(s.Tenants.Min), fmtp(s.Tenants.Median), fmtp(s.Tenants.Max))
		fmt.Fprintf(tw, "status_200\t%d\t\t\t\n", s.Status200)
	case "allocators":
		fmt.Fprintln(tw, "allocator\ttrials\ttenants_median\tnever_written_share_median\tsource_age_median\t")
		for _, x := range r.Rows {
			row := x.(AllocatorRow)
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t\n", row.Allocator, row.Trials, fmtp(row.TenantsMedian), fmtp(row.NeverWrittenShareMedian), fmtp(row.SourceAgeMedian))
		}
	case ExperimentAdvisories:
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "bug\tvariant\trequests\trefused\tleaking\tcut\trecorded\tdetect_rate\tweak\tmax_victim_run\tbound\tleaked (sample)\t")
		for _, x := range r.Rows {
			row := x.(AdvisoryRow)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%q\t\n", row.Bug, row.Variant, row.Requests, row.Refused,
				row.Leaking, row.Cut, row.Recorded, fmtp(row.DetectRate), row.Weak, row.MaxVictimRun, row.Bound, row.LeakedText)
		}
	case "fixes":
		fmt.Fprintln(tw, "fix\ttrials\tstatus_200\tstatuses\tforeign_share_median\t")
		for _, x := range r.Rows {
			row := x.(FixRow)
			fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%s\t\n", row.Fix, row.Trials, row.Status200, row.Statuses, fmtp(row.ForeignShareMedian))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
}
