package admission

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/request"
)

// Roomiest is the index of the path that admits the largest prompt.
func Roomiest(routes []backends.Route, output, tenantMax int) int {
	return roomiest(maxPrompts(nil, routes, output, tenantMax))
}

// maxPrompts appends each path's largest admitted prompt (policy.MaxPrompt) to buf.
func maxPrompts(buf []int, routes []backends.Route, output, tenantMax int) []int {
	for i := range routes {
		buf = append(buf, policy.MaxPrompt(routes[i].Path, output, tenantMax))
	}
	return buf
}

// roomiest is the index of the largest of maxes (the first of equals).
func roomiest(maxes []int) int {
	best := 0
	for i, m := range maxes {
		if m > maxes[best] {
			best = i
		}
	}
	return best
}

// Result is a decision on a request's paths.
type Result struct {
	// Pick is the index of the path chosen, -1 when none admits.
	Pick     int
	Decision policy.Decision
	// Undecided: some path refused only for want of a sound count (503, not 413).
	Undecided bool
	// Estimate is the largest complete local estimate of a prompt (0 when none ran), to learn
	// the safety ratio from what the engine reports.
	Estimate int
}

// DecidePaths decides the request path by path, least loaded first, and picks the first path
// that admits it (so the least-loaded admitting one). Counts are per path
// because engines may tokenize differently: an estimate may admit only where calibration trusts
// it, and an exact count comes from the engines of the path being decided. When no path admits,
// the decision is the roomiest path's refusal (with Limit = the overall limit) and Pick is -1;
// Undecided then says whether some path refused only for want of a sound count. failClosed
// admits only token-id prompts (policy.Request.FailClosed): the model's admission is fail-closed
// after count drift.
func (g *Counter) DecidePaths(prompts []request.Prompt, routes []backends.Route, output, tenantMax, limit int, failClosed bool) Result {
	var buf [4]int
	return g.decidePaths(prompts, routes, maxPrompts(buf[:0], routes, output, tenantMax), limit, failClosed)
}

// decidePaths is DecidePaths with each path's largest admitted prompt known (maxes, by route).
func (g *Counter) decidePaths(prompts []request.Prompt, routes []backends.Route, maxes []int, limit int, failClosed bool) Result {
	loads := make([]int64, len(routes))
	for i := range routes {
		loads[i] = routes[i].Load()
	}
	var orderBuf [8]int
	order := policy.OrderInto(orderBuf[:0], loads, rand.IntN)
	ratio := g.Ratio()
	// One estimate per prompt serves every path: it runs to the largest limit's stopping point.
	stop := 0
	if limit >= 0 {
		stop = int(math.Floor(float64(limit)*ratio)) + 1
	}
	ests := make([]cachingEstimator, len(prompts)) // one allocation for every prompt's
	for i := range ests {
		ests[i] = cachingEstimator{Estimator: g.Encoder, minStop: stop}
	}
	res := Result{Pick: -1}
	var cache map[string]int // exact counts: only with an exact counter (pathCounter)
	if g.exact != nil {
		cache = map[string]int{}
	}
	room := roomiest(maxes)
	var refusal policy.Decision
	for _, i := range order {
		d := g.decideOn(prompts, &routes[i], maxes[i], ratio, ests, cache, &res.Estimate, failClosed)
		if d.Admit {
			d.Limit = limit
			res.Pick, res.Decision, res.Undecided = i, d, false
			return res
		}
		res.Undecided = res.Undecided || d.Undecided
		if i == room {
			refusal = d
		}
	}
	refusal.Limit = limit
	res.Decision = refusal
	return res
}

// decideOn counts every prompt of the request (a batch has several) against one path's limit.
// The path admits only if all fit; the decision reported is the largest prompt's.
func (g *Counter) decideOn(prompts []request.Prompt, r *backends.Route, limit int, ratio float64, ests []cachingEstimator, cache map[string]int, estimate *int, failClosed bool) policy.Decision {
	var exact policy.ExactCounter // no exact counter: a nil interface, not a nil pointer
	var pc *pathCounter
	if g.exact != nil {
		pc = &pathCounter{g: g, route: r, cache: cache}
		exact = pc
	}
	distrust := g.distrusted(r)
	var worst policy.Decision
	for i, p := range prompts {
		if pc != nil {
			pc.prompt, pc.est = i, &ests[i]
		}
		pr := policy.Request{Text: p.Text, Bytes: len(p.Text), InputIDs: p.IDs, HasInputIDs: p.HasIDs,
			Overhead: specialTokenAllowance, DistrustEstimate: distrust, LocalExact: g.o.LocalExact, FailClosed: failClosed}
		if g.o.LocalExact {
			// A rendered template holds every special token the engine counts; a text prompt
			// gets what the tokenizer's post-processor adds (a BOS token for some models).
			pr.Overhead = g.o.LocalTextOverhead
			if p.Templated {
				pr.Overhead = 0
			}
		}
		// An image's tokens are not in the text: the processor expands it (request.CountImages).
		pr.Overhead += p.ImageTokens
		d := policy.Decide(context.Background(), pr, limit, &ests[i], ratio, exact)
		if e := &ests[i]; e.complete && e.n > *estimate {
			*estimate = e.n
		}
		if i == 0 || !d.Admit && worst.Admit || d.Admit == worst.Admit && d.Tokens > worst.Tokens {
			worst = d
		}
		if !d.Admit {
			break // the path refuses: the other prompts need not be counted for it
		}
	}
	return worst
}

// specialTokenAllowance covers tokens an engine adds to a text prompt (BOS, EOS) that are not
// in the text: the byte bound is only sound with them added.
const specialTokenAllowance = 2

// cachingEstimator counts one prompt once for every path: the first count runs at least to
// minStop (the stopping point of the largest limit), and later calls reuse it. It also remembers
// the complete estimate, to learn the safety ratio from engine reports.
type cachingEstimator struct {
	policy.Estimator
	minStop  int
	done     bool
	n        int
	complete bool
}

func (c *cachingEstimator) Count(text string, stopAfter int) (int, bool) {
	if !c.done {
		stop := stopAfter
		if stop >= 0 && c.minStop > stop {
			stop = c.minStop
		}
		c.n, c.complete = c.Estimator.Count(text, stop)
		c.done = true
	}
	// An incomplete count that stopped past stopAfter still says "more than stopAfter".
	return c.n, c.complete || stopAfter >= 0 && c.n > stopAfter
}
