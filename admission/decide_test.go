package admission_test

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tokenize"
)

// unified is a one-engine path with SGLang's own max_req_input_len for its pool and context.
func unified(name string, pool, ctx int) backends.Route {
	return backends.Route{
		Path:    policy.Path{Backends: []string{name}, PoolTokens: pool, ContextLen: ctx, MaxReqInputLen: min(ctx-1, pool-1) - 5},
		Unified: &backends.Backend{Name: name, Role: config.RoleUnified},
	}
}

func encoder(t *testing.T) tokenize.Encoder {
	t.Helper()
	enc, err := tokenize.NewEncoder(tokenize.LibraryTiktokenGo, tokenize.EncodingCl100k)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// localCounter counts with the served model's tokenizer (tier local): its counts are exact, so
// no engine is asked and no calibration is needed.
func localCounter(t *testing.T) (*admission.Counter, tokenize.Encoder) {
	enc := encoder(t)
	return admission.New(admission.Options{Encoder: enc, Ratio: tokenize.NewSafetyRatio(1.1, 2), LocalExact: true}), enc
}

func prose(words int) string {
	return strings.TrimSpace(strings.Repeat("the quick brown fox jumps ", words/5+1))
}

func TestRoomiestIsTheLargestAdmittedPrompt(t *testing.T) {
	routes := []backends.Route{unified("small", 1000, 8192), unified("big", 6000, 8192), unified("short", 9000, 2048)}
	if got := admission.Roomiest(routes, 0, 0); got != 1 {
		t.Fatalf("roomiest with no output: %d, want 1 (pool 6000 under a context of 8192)", got)
	}
	// Reserving 7,000 output tokens leaves the big path 1,191 tokens of context: the short
	// context's path (2047 - 7000 < 0) and the small pool (994) admit less.
	if got := admission.Roomiest(routes, 7000, 0); got != 1 {
		t.Fatalf("roomiest with output 7000: %d, want 1", got)
	}
	// A tenant cap applies to every path alike: the first of the tied paths stays.
	if got := admission.Roomiest(routes, 0, 500); got != 0 {
		t.Fatalf("roomiest under a 500-token tenant cap: %d, want 0", got)
	}
}

func TestDecidePicksAPathThatHoldsThePrompt(t *testing.T) {
	g, enc := localCounter(t)
	routes := []backends.Route{unified("small", 1000, 8192), unified("big", 6000, 8192)}
	text := prose(2000)
	want, _ := enc.Count(text, -1)
	if want <= 1000 || want >= 6000 {
		t.Fatalf("the prompt counts %d tokens: the test needs one between the two pools", want)
	}
	limit := policy.Limit([]policy.Path{routes[0].Path, routes[1].Path}, 0, 0)
	res := g.DecidePaths([]request.Prompt{{Text: text, Templated: true}}, routes, 0, 0, limit, false)
	if res.Pick != 1 || !res.Decision.Admit || res.Undecided {
		t.Fatalf("want the big path admitted, got %+v", res)
	}
	if res.Decision.Tokens != want || res.Decision.Tier != policy.TierLocal {
		t.Fatalf("the local tier counts exactly: got %d tokens (%v), want %d", res.Decision.Tokens, res.Decision.Tier, want)
	}
	if res.Decision.Limit != limit {
		t.Fatalf("decision limit %d, want %d", res.Decision.Limit, limit)
	}
}

func TestDecideRefusesWhatNoPathHolds(t *testing.T) {
	g, enc := localCounter(t)
	routes := []backends.Route{unified("small", 1000, 8192), unified("big", 6000, 8192)}
	limit := policy.Limit([]policy.Path{routes[0].Path, routes[1].Path}, 0, 0)
	big := prose(8000)
	res := g.DecidePaths([]request.Prompt{{Text: big, Templated: true}}, routes, 0, 0, limit, false)
	if res.Pick != -1 || res.Decision.Admit || res.Undecided {
		t.Fatalf("want a refusal (413), got %+v", res)
	}
	if res.Decision.Limit != limit || res.Decision.Tokens <= limit {
		t.Fatalf("the refusal names %d tokens against %d, want more than the limit %d", res.Decision.Tokens, res.Decision.Limit, limit)
	}
	// A batch is admitted only when every prompt fits one path; the refusal is the largest's.
	small := prose(100)
	res = g.DecidePaths([]request.Prompt{{Text: small, Templated: true}, {Text: big, Templated: true}}, routes, 0, 0, limit, false)
	if res.Pick != -1 || res.Decision.Admit {
		t.Fatalf("a batch with one prompt over every pool was admitted: %+v", res)
	}
	if n, _ := enc.Count(small, -1); res.Decision.Tokens <= n {
		t.Fatalf("the batch's refusal reports %d tokens, not the large prompt's", res.Decision.Tokens)
	}
	// Output reserved counts against the context: a prompt that fits the pool but not beside
	// its output is refused.
	fits := prose(2000)
	res = g.DecidePaths([]request.Prompt{{Text: fits, Templated: true}}, routes[1:], 7000, 0, policy.Limit([]policy.Path{routes[1].Path}, 7000, 0), false)
	if res.Pick != -1 {
		t.Fatalf("prompt plus 7,000 output tokens over an 8,192 context was admitted: %+v", res)
	}
	// A tenant's own cap refuses too.
	res = g.DecidePaths([]request.Prompt{{Text: fits, Templated: true}}, routes, 0, 100, policy.Limit([]policy.Path{routes[0].Path, routes[1].Path}, 0, 100), false)
	if res.Pick != -1 {
		t.Fatalf("a prompt over the tenant's 100-token cap was admitted: %+v", res)
	}
}

// Without the model's own tokenizer and with no engine to ask, the byte bound still admits
// small prompts, but a prompt the estimate cannot settle on an uncalibrated engine is undecided
// (503 count_unavailable), never admitted on a guess.
func TestDecideWithoutASoundCountIsUndecided(t *testing.T) {
	g := admission.New(admission.Options{Encoder: encoder(t), Ratio: tokenize.NewSafetyRatio(1.1, 2)})
	routes := []backends.Route{unified("a", 4096, 8192)}
	limit := policy.Limit([]policy.Path{routes[0].Path}, 0, 0)
	res := g.DecidePaths([]request.Prompt{{Text: "hello there"}}, routes, 0, 0, limit, false)
	if res.Pick != 0 || res.Decision.Tier != policy.TierBound {
		t.Fatalf("a tiny prompt is admitted by its byte bound: %+v", res)
	}
	near := prose(3500) // more bytes than the limit, fewer estimated tokens
	res = g.DecidePaths([]request.Prompt{{Text: near}}, routes, 0, 0, limit, false)
	if res.Pick != -1 || !res.Undecided {
		t.Fatalf("a gray-zone prompt on an uncalibrated engine without an exact counter: want undecided, got %+v", res)
	}
}

// Issue 40's whole-pool shape is admitted, by decision: prompt + max_tokens over the pool
// (19 + 30,000 against 20,000) but under the context is what SGLang serves (it cuts
// max_new_tokens to max_req_len − prompt − 1, below the pool), so it is not a 413; the
// admission queue books it at the whole pool and passes it (fairqueue). Over the context it is
// refused, as the engine would.
func TestOutputOverThePoolIsAdmittedOverTheContextRefused(t *testing.T) {
	g, _ := localCounter(t)
	routes := []backends.Route{unified("sim", 20000, 32768)}
	backends.SetCapacityForTest(routes[0].Unified, &backends.Capacity{PoolTokens: 20000, ContextLen: 32768})
	prompt := []request.Prompt{{Text: prose(15), Templated: true}}
	paths := []policy.Path{routes[0].Path}
	res := g.DecidePaths(prompt, routes, 30000, 0, policy.Limit(paths, 30000, 0), false)
	if res.Pick != 0 || !res.Decision.Admit {
		t.Fatalf("prompt + 30,000 output tokens over a 20,000-token pool, under a 32,768 context: want admitted, got %+v", res)
	}
	if need, pool := routes[0].KVNeed(res.Decision.Tokens, 30000); need != 20000 || pool != 20000 {
		t.Fatalf("its KV need is %d of %d, want the whole pool (20,000 of 20,000)", need, pool)
	}
	res = g.DecidePaths(prompt, routes, 32768, 0, policy.Limit(paths, 32768, 0), false)
	if res.Pick != -1 || res.Decision.Admit {
		t.Fatalf("prompt + 32,768 output tokens over a 32,768 context: want refused (413), got %+v", res)
	}
}
