package request

import (
	"strings"
	"testing"
)

// TestAdvisoryFields: each field of the year's advisories (issue 39) has its own row, with the
// verdict the engines' behaviour calls for. A refused field is a 400 naming it whose message says
// what the engine would have done with it (a field with no row is refused too, but as unknown:
// these tests fail without the rows). vLLM's thinking_token_budget is refused (GHSA-fpch-3xrf-7q96);
// SGLang's and Anthropic's thinking budgets pass and add nothing to the output the rule reserves:
// thinking tokens are output tokens inside max_new_tokens and max_tokens.
func TestAdvisoryFields(t *testing.T) {
	refusals := []struct {
		kind        Kind
		body, param string
		says        string
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"mm_hashes":{"image":["aa"]}}`, "mm_hashes", "CVE-2026-111392"},
		{Generate, `{"text":"hi","mm_hashes":["aa"]}`, "mm_hashes", "cache keys"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1}`, "prompt_logprobs", "CVE-2026-116180"},
		{Completions, `{"model":"m","prompt":"hi","prompt_logprobs":5}`, "prompt_logprobs", "crashes engines"},
		{Generate, `{"text":"hi","sampling_params":{"max_new_tokens":4,"prompt_logprobs":1}}`, "sampling_params.prompt_logprobs", "CVE-2026-116180"},
		{Completions, `{"model":"m","prompt":"","prompt_embeds":"AAAA"}`, "prompt_embeds", "embeddings"},
		{Generate, `{"text":"hi","input_embeds":[[0.1]]}`, "input_embeds", "embeddings"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"mm_processor_kwargs":{"max_pixels":1}}`, "mm_processor_kwargs", "processor"},
		{Generate, `{"text":"hi","rid":"a"}`, "rid", "CVE-2026-112266"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"rid":"a"}`, "rid", "gateway's own"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"request_id":"r"}`, "request_id", "gateway's own"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"thinking_token_budget":5000}`, "thinking_token_budget", "GHSA-fpch-3xrf-7q96"},
		{Completions, `{"model":"m","prompt":"hi","max_tokens":7,"thinking_token_budget":5000}`, "thinking_token_budget", "reasoning-end"},
	}
	for _, c := range refusals {
		_, e := Parse(c.kind, []byte(c.body))
		if e == nil {
			t.Errorf("%s %s: passed", c.kind.Path(), c.body)
			continue
		}
		if e.Status != 400 || e.Param != c.param || !strings.Contains(e.Message, c.says) {
			t.Errorf("%s %s: %d param %q %q; want 400 naming %s and saying %q", c.kind.Path(), c.body, e.Status, e.Param, e.Message, c.param, c.says)
		}
	}

	budgets := []struct {
		kind   Kind
		body   string
		output int
	}{
		{Generate, `{"text":"hi","sampling_params":{"max_new_tokens":9,"thinking_budget":5000}}`, 9},
		{Messages, `{"model":"m","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"hi"}]}`, 2048},
	}
	for _, c := range budgets {
		r, e := Parse(c.kind, []byte(c.body))
		if e != nil {
			t.Errorf("%s %s: %s (%s)", c.kind.Path(), c.body, e.Message, e.Param)
			continue
		}
		if r.Output != c.output {
			t.Errorf("%s %s: output %d reserved, want %d (the budget is inside it)", c.kind.Path(), c.body, r.Output, c.output)
		}
	}
}
