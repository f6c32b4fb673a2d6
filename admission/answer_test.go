package admission_test

import (
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tokenize"
)

// The admission question, one row per rule: the refusal (status, reason, log-only reason), the
// route, and the one Need that the limits and the queue reserve.
func TestDecideAnswers(t *testing.T) {
	g, enc := localCounter(t)
	routes := []backends.Route{unified("small", 1000, 8192), unified("big", 6000, 8192)}
	text := prose(2000)
	n, _ := enc.Count(text, -1)
	over := prose(8000)
	for _, c := range []struct {
		name    string
		ask     admission.Ask
		status  int    // 0: admitted
		reason  string // the access line's decision
		verdict string
		route   string
		need    admission.Need
		counted bool // a count ran (the 413 on bytes comes before any)
	}{
		{name: "admitted, output named", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: text, Templated: true}}, Output: 100, OutputGiven: true, N: 1},
			reason: policy.ReasonOK, verdict: admission.VerdictAdmit, route: "big", need: admission.Need{Prompt: int64(n), Output: 100}, counted: true},
		{name: "admitted, no output named: n × the largest context less the prompt", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: text, Templated: true}}, N: 2, DefaultMaxTokens: 16},
			reason: policy.ReasonOK, verdict: admission.VerdictAdmit, route: "big", need: admission.Need{Prompt: int64(n), Output: 2*8192 - int64(n), Owable: 2*8192 - int64(n)}, counted: true},
		{name: "a batch reserves per item", ask: admission.Ask{Kind: request.Completions, Prompts: []request.Prompt{{Text: text, Templated: true}, {Text: "hi", Templated: true}}, Output: 10, OutputGiven: true, N: 1},
			reason: policy.ReasonOK, verdict: admission.VerdictAdmit, route: "big", need: admission.Need{Prompt: 2 * int64(n), Output: 20}, counted: true},
		{name: "413 on the engines' limit", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: over, Templated: true}}, N: 1, OverflowStatus: 413},
			status: 413, reason: policy.ReasonContextLength, verdict: admission.VerdictRefuse, counted: true},
		{name: "413 on the tenant's max_prompt_tokens", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: text, Templated: true}}, N: 1, TenantMaxPrompt: 100, OverflowStatus: 413},
			status: 413, reason: policy.ReasonTenantMaxPrompt, verdict: admission.VerdictRefuse, counted: true},
		{name: "413 on the tenant's max_prompt_bytes, before any counting", ask: admission.Ask{Kind: request.Messages, Prompts: []request.Prompt{{Text: text, Templated: true}}, N: 1, TenantMaxPromptBytes: 1000, PromptBytes: len(text), OverflowStatus: 413},
			status: 413, reason: admission.ReasonTenantMaxPromptBytes, verdict: admission.VerdictRefuse},
		{name: "max_prompt_bytes comes before the engines' limit: one byte over, nothing counted", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: over, Templated: true}}, N: 1, TenantMaxPromptBytes: len(over) - 1, PromptBytes: len(over), OverflowStatus: 413},
			status: 413, reason: admission.ReasonTenantMaxPromptBytes, verdict: admission.VerdictRefuse},
		{name: "max_prompt_bytes that holds the prompt changes nothing", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: text, Templated: true}}, Output: 1, OutputGiven: true, N: 1, TenantMaxPromptBytes: len(text), PromptBytes: len(text)},
			reason: policy.ReasonOK, verdict: admission.VerdictAdmit, route: "big", need: admission.Need{Prompt: int64(n), Output: 1}, counted: true},
		{name: "monitor mode serves the roomiest path", ask: admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: over, Templated: true}}, Output: 5, OutputGiven: true, N: 1, Monitor: true},
			reason: policy.ReasonContextLength, verdict: admission.VerdictMonitorPass, route: "big", counted: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.ask.Routes = routes
			a := g.Decide(c.ask)
			if a.Reason != c.reason || a.Verdict != c.verdict {
				t.Fatalf("reason %q verdict %q, want %q %q", a.Reason, a.Verdict, c.reason, c.verdict)
			}
			if counted := a.Decision.Tier != ""; counted != c.counted {
				t.Fatalf("counted %v (%+v), want %v", counted, a.Decision, c.counted)
			}
			if c.status != 0 {
				if a.Refusal == nil || a.Refusal.Status != c.status || a.Refusal.Reason != c.reason || a.Route != nil || a.Need != (admission.Need{}) {
					t.Fatalf("want a %d refusal and nothing reserved, got %+v", c.status, a)
				}
				if a.Refusal.Param != c.ask.Kind.PromptParam() {
					t.Fatalf("the refusal names %q, want the prompt's field %q", a.Refusal.Param, c.ask.Kind.PromptParam())
				}
				return
			}
			if a.Refusal != nil || a.Route == nil || a.Route.Unified.Name != c.route {
				t.Fatalf("want route %s, got %+v", c.route, a)
			}
			if c.verdict == admission.VerdictAdmit && a.Need != c.need {
				t.Fatalf("need %+v, want %+v", a.Need, c.need)
			}
		})
	}
}

// A prompt no sound count can settle is a retryable 503, and fail-closed names the model.
func TestDecideUndecidedAnswers(t *testing.T) {
	g := admission.New(admission.Options{Encoder: encoder(t), Ratio: tokenize.NewSafetyRatio(1.1, 2)})
	ask := admission.Ask{Kind: request.Chat, Prompts: []request.Prompt{{Text: prose(3500)}}, N: 1, Routes: []backends.Route{unified("a", 4096, 8192)}, OverflowStatus: 413}
	if a := g.Decide(ask); a.Refusal == nil || a.Refusal.Status != 503 || a.Refusal.Code != "count_unavailable" || a.Verdict != admission.VerdictUnavailable {
		t.Fatalf("undecided: %+v", a)
	}
	ask.FailClosed, ask.FailClosedModel, ask.FailClosedRetryAfter = true, "m", 30
	if a := g.Decide(ask); a.Refusal == nil || a.Refusal.Status != 503 || a.Refusal.RetryAfter != 30 {
		t.Fatalf("fail-closed: %+v", a.Refusal)
	}
}

// The Need rule: what the request names, else n × context less the prompt, never below zero.
func TestNeedOf(t *testing.T) {
	for _, c := range []struct {
		tokens, items, output int
		given                 bool
		n, ctx                int
		want                  admission.Need
	}{
		{100, 1, 50, true, 1, 8192, admission.Need{100, 50, 0}},
		{100, 3, 50, true, 1, 8192, admission.Need{300, 150, 0}},
		{100, 1, 0, false, 1, 8192, admission.Need{100, 8092, 8092}},
		{100, 0, 0, false, 2, 8192, admission.Need{100, 16284, 16284}},
		{9000, 1, 0, false, 1, 8192, admission.Need{9000, 0, 0}},
	} {
		if got := admission.NeedOf(c.tokens, c.items, c.output, c.given, c.n, c.ctx); got != c.want {
			t.Errorf("%+v: %+v", c, got)
		}
	}
}
