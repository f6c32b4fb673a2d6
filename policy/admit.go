// Package policy owns the admission decision: given what a request needs and what each path to
// the engines can hold, admit or refuse, and say which counting tier decided. The rule itself is
// pure and table-tested; the only effects are the estimator and the exact counter passed in.
// It never sends a request to an engine and never reads configuration files.
package policy

import (
	"context"
	"math"
)

// Path is one way to serve a request: a unified backend, or a prefill + decode pair. Its limits
// are the strictest of its backends' (the engine rejects at the smallest).
type Path struct {
	Backends []string
	// MaxReqInputLen is SGLang's max_req_input_len (min over the path): the engine rejects P ≥ it.
	MaxReqInputLen int
	// ContextLen is /v1/models max_model_len (min over the path).
	ContextLen int
	// PoolTokens is the KV pool, max_total_num_tokens (min over the path, and over each
	// engine's DP ranks: a request runs on one rank, in that rank's pool). Admission holds
	// against the pool itself whatever else an engine says: a prompt never exceeds it, even
	// when a reported max_req_input_len or context is larger (the incident's shape).
	PoolTokens int
	// PageSize is the engines' KV page in tokens (max over the path); below 1 counts as 1.
	// SGLang's scheduler reserves a page per request on top of the prompt (PrefillAdder:
	// prompt + clamped output + page_size < the free pool, the output clamped to
	// pool − ceil_page(P) − page − 1 and never below 0), so a prompt P with P + page ≥ pool
	// passes the input check (P < max_req_input_len) and then waits forever (sglang#39271).
	PageSize int
	// DecodePool and DecodeReserve are a prefill + decode pair's decode server's pool (its
	// smallest DP rank's) and num_reserved_decode_tokens: it preallocates a transferred request
	// only while P + reserve fits its free pool (SGLang's DecodePreallocQueue), so past
	// P + reserve > pool the request never runs. DecodePool 0: no decode server on the path.
	DecodePool, DecodeReserve int
}

// schedulable is the largest prompt the engines' schedulers can ever run on p: P + page < pool
// and, with a decode server, P + reserve ≤ its pool.
func (p Path) schedulable() int {
	m := p.PoolTokens - max(p.PageSize, 1) - 1
	if p.DecodePool > 0 {
		m = min(m, p.DecodePool-max(p.DecodeReserve, 0))
	}
	return m
}

// MaxPrompt is the largest prompt P that the admission rule admits on p:
// P < mril, P + page < pool, P + reserve ≤ decode pool (a pair), P < ctx, P + O < ctx, and
// P ≤ tenantMax when tenantMax > 0. It
// may be negative (nothing fits, e.g. when the requested output alone fills the context).
func MaxPrompt(p Path, output, tenantMax int) int {
	m := min(p.MaxReqInputLen-1, p.schedulable(), p.ContextLen-1, p.ContextLen-1-output)
	if tenantMax > 0 {
		m = min(m, tenantMax)
	}
	return m
}

// Admits is the admission rule written exactly as DESIGN.md states it; MaxPrompt must agree with
// it at every boundary (tested).
func Admits(p Path, prompt, output, tenantMax int) bool {
	return prompt < p.MaxReqInputLen && prompt+max(p.PageSize, 1) < p.PoolTokens &&
		(p.DecodePool == 0 || prompt+max(p.DecodeReserve, 0) <= p.DecodePool) && prompt < p.ContextLen &&
		prompt+output < p.ContextLen && (tenantMax == 0 || prompt <= tenantMax)
}

// Limit is the largest prompt that any of paths admits (math.MinInt when there are none).
func Limit(paths []Path, output, tenantMax int) int {
	best := math.MinInt
	for _, p := range paths {
		best = max(best, MaxPrompt(p, output, tenantMax))
	}
	return best
}

// Eligible returns the indexes of the paths that admit a prompt of (at most) tokens tokens.
func Eligible(paths []Path, tokens, output, tenantMax int) []int {
	var out []int
	for i, p := range paths {
		if MaxPrompt(p, output, tenantMax) >= tokens {
			out = append(out, i)
		}
	}
	return out
}

// Zone is where an estimate falls relative to a limit under a safety ratio.
type Zone int

const (
	ZoneAdmit  Zone = iota // estimate × r fits: admit
	ZoneRefuse             // estimate ÷ r is still over: refuse
	ZoneGray               // in between: ask for the exact count
)

// Classify places estimate against limit with safety ratio r ≥ 1.
func Classify(estimate int, r float64, limit int) Zone {
	switch {
	case float64(estimate)*r <= float64(limit):
		return ZoneAdmit
	case float64(estimate)/r > float64(limit):
		return ZoneRefuse
	default:
		return ZoneGray
	}
}

// Tier names what decided.
type Tier string

const (
	TierInputIDs Tier = "input_ids" // token ids given: the count is exact
	TierBound    Tier = "bound"     // bytes ≥ tokens, and the bytes fit
	TierEstimate Tier = "estimate"  // tiktoken estimate × or ÷ the safety ratio decided
	TierExact    Tier = "exact"     // the engine's /tokenize counted
	// TierLocal: the served model's own tokenizer and chat template counted here (tokenizer.hf_dir):
	// exact, with no ratio and no engine asked.
	TierLocal Tier = "local"
	// TierUnavailable: the estimate could not decide and no usable exact count came (saturated,
	// failed, or implausible). Nothing decided: the request is neither admitted nor called too
	// long (the gateway answers 503 count_unavailable, retryable).
	TierUnavailable Tier = "unavailable"
)

// Estimator counts tokens with early exit (tokenize.Encoder satisfies it).
type Estimator interface {
	Count(text string, stopAfter int) (n int, complete bool)
}

// ExactCounter asks an engine for the exact count of the rendered prompt. It returns an error
// when saturated or unavailable; the caller then falls back.
type ExactCounter interface {
	Exact(ctx context.Context, text string) (int, error)
}

// Request is what admission needs to know about one request.
type Request struct {
	// Text is the rendered prompt (template and canary included) when the request is text.
	Text string
	// Bytes is the byte bound of everything rendered into the prompt (≥ len(Text)).
	Bytes int
	// InputIDs is the number of token ids when the request gave ids; HasInputIDs says so.
	InputIDs    int
	HasInputIDs bool
	// Overhead is how many tokens the engine may add to a text prompt beyond its text (BOS,
	// EOS): added to the byte bound and to estimates. Exact counts include them already.
	Overhead int
	// DistrustEstimate says an estimate may refuse but never admit: the engine's tokenizer was
	// seen counting more than estimate × ratio (calibration against its /tokenize), or it could
	// not be calibrated at all.
	DistrustEstimate bool
	// LocalExact says the estimator is the served model's own tokenizer counting Text as the
	// engine will: its count is exact, so it decides alone (no byte bound, ratio or engine).
	LocalExact bool
	// FailClosed: the model's admission is fail-closed because its engines counted more prompt
	// tokens than the gateway's bound (count drift): the gateway's model of what the engine
	// renders is wrong, and an engine's /tokenize of the gateway's rendering is no better. Only
	// token ids, whose count no template changes, admit; the other counts may still refuse.
	FailClosed bool
}

// Decision is the outcome of counting against a limit.
type Decision struct {
	Admit bool
	Tier  Tier
	// Tokens is the count used: for an admit an upper bound on the engine's count (route on it),
	// for a refusal the best count known (shown to the client).
	Tokens int
	// Limit is the largest prompt some path admits.
	Limit int
	// Undecided: refused only because no count could decide (TierUnavailable); retrying may
	// admit. Not a statement that the prompt is too long.
	Undecided bool
}

// Decide counts req just as far as needed to compare it with limit, cheapest tier first:
// input ids are exact; the byte bound admits most traffic without tokenizing; the estimate
// with early exit decides clear cases; the rest (the gray zone, and every prompt over the byte
// bound when the estimate is distrusted) needs an exact count (exact nil: none). An exact count
// that is not plausible (below one token, above the byte bound) is no count; the counter checks
// each engine's count against that engine's calibration. Without a count, nothing is decided:
// Undecided, never an admit.
func Decide(ctx context.Context, req Request, limit int, est Estimator, ratio float64, exact ExactCounter) Decision {
	d := Decision{Limit: limit}
	if req.HasInputIDs {
		d.Tier, d.Tokens, d.Admit = TierInputIDs, req.InputIDs, req.InputIDs <= limit
		return d
	}
	if req.FailClosed {
		// Decided as if the estimate were distrusted and no engine could count; what would
		// admit decides nothing.
		req.FailClosed, req.DistrustEstimate = false, true
		d = Decide(ctx, req, limit, est, ratio, nil)
		if d.Admit {
			d.Tier, d.Admit, d.Undecided = TierUnavailable, false, true
		}
		return d
	}
	if req.LocalExact {
		// Prompts near the limit are counted whole, so a refusal shows their real count; a
		// huge one stops at twice the limit (the outcome is the same, the CPU is not).
		n, complete := est.Count(req.Text, 2*max(limit, 0)+1024)
		n += req.Overhead
		d.Tier, d.Tokens, d.Admit = TierLocal, n, complete && n <= limit
		return d
	}
	bound := req.Bytes + req.Overhead
	if bound <= limit {
		d.Tier, d.Tokens, d.Admit = TierBound, bound, true
		return d
	}
	if limit < 0 {
		// Nothing fits; one token is a lower bound for any non-empty prompt.
		d.Tier, d.Tokens = TierEstimate, 1
		if n, _ := est.Count(req.Text, 0); n > 1 {
			d.Tokens = n
		}
		return d
	}
	// Counting past limit×r cannot change the outcome: stop there.
	stopAfter := int(math.Floor(float64(limit)*ratio)) + 1
	n, _ := est.Count(req.Text, stopAfter)
	n += req.Overhead
	d.Tier = TierEstimate
	switch Classify(n, ratio, limit) {
	case ZoneAdmit:
		if !req.DistrustEstimate {
			d.Admit, d.Tokens = true, upper(n, ratio, bound)
			return d
		}
	case ZoneRefuse:
		d.Tokens = n
		return d
	}
	if exact != nil {
		if e, err := exact.Exact(ctx, req.Text); err == nil && plausible(e, bound) {
			d.Tier, d.Tokens, d.Admit = TierExact, e, e <= limit
			return d
		}
	}
	// An estimate × ratio in the gray zone is over the limit and the byte bound is too: no
	// sound count admits, and none shows the prompt too long either.
	d.Tier, d.Tokens, d.Undecided = TierUnavailable, n, true
	return d
}

// plausible says whether an engine's exact count e of a non-empty text can be true: at least one
// token, at most the byte bound (no tokenizer in use emits more than a token per byte).
func plausible(e, bound int) bool { return e >= 1 && e <= bound }

// upper is the estimate scaled by the ratio, never above the byte bound (which is sound).
func upper(n int, r float64, bytes int) int {
	return min(int(math.Ceil(float64(n)*r)), bytes)
}
