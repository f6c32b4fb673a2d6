package admission

import (
	"fmt"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/request"
)

// Ask is the admission question: one request, the paths that could serve it and the rules that
// apply. Everything the decision reads is here; Decide reads nothing else.
type Ask struct {
	Kind request.Kind
	// Prompts are the request's prompts, rendered and marked as the engine will read them.
	Prompts []request.Prompt
	// Output is the output length the request names (OutputGiven), for every sequence of an
	// item; N is the sequences per item (n, best_of; at least 1).
	Output      int
	OutputGiven bool
	N           int
	Routes      []backends.Route
	// DefaultMaxTokens is policy.default_max_tokens: the rule's output for a request that names
	// none (Output).
	DefaultMaxTokens int
	// TenantMaxPrompt is the tenant's max_prompt_tokens (0: none); TenantMaxPromptBytes its
	// max_prompt_bytes (0: none), held against PromptBytes (the prompt's text as the client sent
	// it, before template and marker) and refused before any counting.
	TenantMaxPrompt      int
	TenantMaxPromptBytes int
	PromptBytes          int
	// FailClosed: the model's admission takes exact counts only (count drift); FailClosedModel
	// names the model in the refusal, retried after FailClosedRetryAfter seconds.
	FailClosed           bool
	FailClosedModel      string
	FailClosedRetryAfter int
	// Monitor: a refusal is logged and the request served on the roomiest path (policy.mode).
	Monitor bool
	// OverflowStatus is the status of a prompt that does not fit (policy.overflow_status).
	OverflowStatus int
}

// Verdicts say what became of the request (the decisions metric's label).
const (
	VerdictAdmit       = "admit"
	VerdictRefuse      = "refuse"
	VerdictUnavailable = "unavailable"
	VerdictMonitorPass = "monitor_pass"
)

// Answer is the admission answer: where the request goes and what it reserves, or the refusal.
type Answer struct {
	// Route is the path chosen (nil when refused).
	Route    *backends.Route
	Decision policy.Decision
	// Estimate is the largest complete local estimate (0: none ran), to learn the ratio from.
	Estimate int
	// Reason is the access line's decision (policy.ReasonOK, a policy.Reason*, count_unavailable).
	Reason  string
	Verdict string
	// Need is what the tenant's limits and the admission queue reserve (nothing when refused).
	Need Need
	// Refusal is the client's error (413, 503 count_unavailable or fail-closed); nil: forward.
	Refusal *apierr.Error
}

// Need is what an admitted request reserves, in tokens, for every item of it together. The one
// rule (both the tenant limits and the admission queue's KV take it as it is):
//
//   - Prompt: the decision's count (the largest prompt's) times the items;
//   - Output: per item, the output the request names (max_tokens and its kin) times n; a
//     request that names none may make the engine generate until the context is full (SGLang
//     caps max_new_tokens at the context less the prompt), so n × the largest context of the
//     model's paths, less the prompt: prompt + output then stays at n × context, a bound on what
//     the reply settles whatever our count's error (issue 31). Times the items.
//
// Owable is the part of Output the request did not bound (all of it when no output length is
// named, else 0): the tenant's tpm may lend it (limits.Limiter.AdmitOwing), so a tenant whose tpm
// is below the context can still send such a request, and the overshoot is repaid before its
// next request passes.
//
// policy.default_max_tokens is not in it: that is the 413 rule's output (RuleOutput), which
// does not bound the engine.
type Need struct {
	Prompt int64
	Output int64
	Owable int64
}

// Tokens is the whole reservation.
func (n Need) Tokens() int64 { return n.Prompt + n.Output }

// NeedOf is Need's rule for a prompt count of tokens (the largest prompt's) over items items, the
// output named (given) or not, n sequences, and the largest context of the paths.
func NeedOf(tokens, items, output int, given bool, n, maxContext int) Need {
	items = max(items, 1)
	per := int64(output)
	if !given {
		per = max(int64(max(n, 1))*int64(maxContext)-int64(tokens), 0)
	}
	need := Need{Prompt: int64(tokens) * int64(items), Output: per * int64(items)}
	if !given {
		need.Owable = need.Output
	}
	return need
}

// RuleOutput is the output the 413 rule leaves room for (policy.Limit's O): what the request
// names, else defaultMax, for each of n sequences. /v1/models states the limit with n = 1.
func RuleOutput(output int, given bool, n, defaultMax int) int {
	if given {
		return output
	}
	return defaultMax * max(n, 1)
}

// reasonCountUnavailable: no path admitted, and some path could not be decided without an exact
// count that was not available.
const reasonCountUnavailable = "count_unavailable"

// ReasonTenantMaxPromptBytes: the prompt's bytes are over the tenant's max_prompt_bytes.
const ReasonTenantMaxPromptBytes = "tenant_max_prompt_bytes"

// Decide answers the admission question: the tenant's byte cap first (before any counting), then
// every path decided least loaded first (DecidePaths), then the refusal or the route and its Need.
func (c *Counter) Decide(a Ask) Answer {
	if a.TenantMaxPromptBytes > 0 {
		if n := a.PromptBytes; n > a.TenantMaxPromptBytes {
			e := &apierr.Error{Status: 413, Type: "invalid_request_error", Code: "context_length_exceeded", Param: a.Kind.PromptParam(),
				Message: fmt.Sprintf("Your prompt is %d bytes, more than this API key's limit of %d prompt bytes (max_prompt_bytes). Please reduce the length of the prompt.", n, a.TenantMaxPromptBytes),
				Reason:  ReasonTenantMaxPromptBytes}
			return Answer{Reason: ReasonTenantMaxPromptBytes, Verdict: VerdictRefuse, Refusal: e}
		}
	}
	output := RuleOutput(a.Output, a.OutputGiven, a.N, a.DefaultMaxTokens)
	// The rule's numbers, all at once: each path's largest prompt, and the overall limit.
	var pathBuf [4]policy.Path // the usual few routes: no allocation
	var maxBuf [4]int
	paths, maxes := pathBuf[:0], maxBuf[:0]
	maxContext := 0
	for i := range a.Routes {
		paths = append(paths, a.Routes[i].Path)
		maxes = append(maxes, policy.MaxPrompt(a.Routes[i].Path, output, a.TenantMaxPrompt))
		maxContext = max(maxContext, a.Routes[i].ContextLen)
	}
	limit := policy.Limit(paths, output, a.TenantMaxPrompt)
	res := c.decidePaths(a.Prompts, a.Routes, maxes, limit, a.FailClosed)
	ans := Answer{Decision: res.Decision, Estimate: res.Estimate}
	pick := res.Pick
	if !res.Decision.Admit {
		ans.Reason = policy.Reason(paths, res.Decision.Tokens, output, a.TenantMaxPrompt)
		if res.Undecided {
			ans.Reason = reasonCountUnavailable
		}
		switch {
		case a.Monitor:
			ans.Verdict = VerdictMonitorPass
			pick = roomiest(maxes)
		case res.Undecided:
			// Some path might admit it, but no sound count could say: not a 413 (the prompt
			// may fit), and never an admit. Retryable.
			ans.Verdict, ans.Refusal = VerdictUnavailable, apierr.CountUnavailable()
			if a.FailClosed {
				ans.Refusal = apierr.CountFailClosed(a.FailClosedModel, a.FailClosedRetryAfter)
			}
			ans.Refusal.Reason = ans.Reason
			return ans
		default:
			ans.Verdict, ans.Refusal = VerdictRefuse, a.tooLong(maxContext, res.Decision.Tokens, output, limit, ans.Reason)
			return ans
		}
	} else {
		ans.Reason, ans.Verdict = policy.ReasonOK, VerdictAdmit
	}
	ans.Route = &a.Routes[pick]
	ans.Need = NeedOf(res.Decision.Tokens, len(a.Prompts), a.Output, a.OutputGiven, a.N, maxContext)
	return ans
}

// tooLong is the 413 (policy.overflow_status): OpenAI's wording on OpenAI routes, SGLang's on
// /generate, Anthropic's on Messages.
func (a *Ask) tooLong(ctxLen, n, output, limit int, reason string) *apierr.Error {
	limit = max(limit, 0)
	e := &apierr.Error{Status: a.OverflowStatus, Type: "invalid_request_error", Code: "context_length_exceeded", Param: a.Kind.PromptParam(), Reason: reason}
	if reason == policy.ReasonTenantMaxPrompt {
		e.Message = fmt.Sprintf("Your prompt resulted in %d tokens, more than this API key's limit of %d prompt tokens. Please reduce the length of the prompt.", n, a.TenantMaxPrompt)
		return e
	}
	reserve := ""
	if output > 0 {
		reserve = fmt.Sprintf(", leaving room for the %d completion tokens requested", output)
	}
	switch a.Kind {
	case request.Generate, request.Encode, request.ClassifyNative:
		e.Message = fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens%s). Use a shorter input.", n, limit, reserve)
	case request.Messages:
		e.Message = fmt.Sprintf("prompt is too long: %d tokens > %d maximum (the engines' limit now%s)", n, limit, reserve)
	case request.Completions, request.Responses, request.Embeddings, request.Rerank, request.Score, request.Classify:
		e.Message = fmt.Sprintf("This model's maximum context length is %d tokens. However, your prompt resulted in %d tokens. Please reduce the length of the prompt. (The engines accept at most %d prompt tokens now%s.)", ctxLen, n, limit, reserve)
	default:
		e.Message = fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages. (The engines accept at most %d prompt tokens now%s.)", ctxLen, n, limit, reserve)
	}
	return e
}
