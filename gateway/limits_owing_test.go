package gateway_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// checkNeverOn asserts a 429 for tokens in the route's envelope without a Retry-After: a request
// no wait makes pass (limits: Never).
func checkNeverOn(t *testing.T, path string, r reply) {
	t.Helper()
	if r.status != 429 {
		t.Fatalf("%s: want 429, got %d %s", path, r.status, r.body)
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		t.Fatalf("%s: a request that can never pass got Retry-After %s: %s", path, ra, r.body)
	}
	if strings.HasPrefix(path, "/v1/messages") {
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" || e.Error.Message == "" {
			t.Fatalf("%s: want Anthropic's envelope: %s", path, r.body)
		}
		return
	}
	if e := decodeError(t, r); e.Error.Type != "tokens" || e.Error.Code != "rate_limit_exceeded" {
		t.Fatalf("%s: 429 envelope: %s", path, r.body)
	}
}

// owingYAML: alice at tpm 20000, the tenant, in front of sim.
func owingYAML(sim string) string { return limitsYAML("", "", "tpm: 20000", "", sim) }

// Issue 37's tpm rule on chat and Responses: a tenant at tpm 20000 on a 65,536-context model sends
// a request without an output length and gets 200 (before, 429 with Retry-After: 60 every time).
// Its whole Need (the context) is charged: with an engine that fills the context, the reply
// settles ~65,535 tokens, so the next request, even a small one with an output length, is refused
// until the debt is repaid, and the wait it is told is at most what one request's owed output
// takes to refill (the bound: one request beyond the bucket), and at least what its settled
// excess does (refill over the test's few seconds is far below the ~130 s owed).
func TestTPMOwesAnUnnamedOutput(t *testing.T) {
	const tpm, ctx = 20000, 65536
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "131072", "--context-length", fmt.Sprint(ctx), "--fill-context")
	for _, c := range []struct{ path, unnamed, small string }{
		{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"write a long story"}]}`,
			`{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`},
		{"/v1/responses", `{"model":"sim","input":"write a long story"}`,
			`{"model":"sim","input":"hi","max_output_tokens":4}`},
	} {
		t.Run(strings.TrimPrefix(c.path, "/v1/"), func(t *testing.T) {
			gw := testkit.StartGateway(t, testkit.ParseConfig(t, owingYAML(sim.URL)))
			before := sim.Stats(t).Requests[c.path]
			r := post(t, gw.URL, c.path, tenantKey, c.unnamed)
			if r.status != 200 {
				t.Fatalf("no output length, tpm %d, context %d: %d %s", tpm, ctx, r.status, r.body)
			}
			if reserved := metric(t, gw.URL, "kvgate_tokens_reserved_total", `tenant="alice"`); reserved != ctx {
				t.Fatalf("reserved %v, want the whole Need (prompt + the context less the prompt = %d)", reserved, ctx)
			}
			var settled float64
			eventually(t, 10*time.Second, "the reply settled beyond the bucket", func() bool {
				settled = metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`)
				return settled > 2*tpm
			})
			r = post(t, gw.URL, c.path, tenantKey, c.small)
			checkRateLimited(t, r, "tokens")
			wait, _ := strconv.Atoi(r.header.Get("Retry-After"))
			owedAtMost := (ctx*60 + tpm - 1) / tpm // a whole request's Need beyond an empty bucket, in seconds
			if owedAtLeast := int(settled-tpm) * 60 / tpm / 2; wait > owedAtMost || wait < owedAtLeast {
				t.Fatalf("Retry-After %d s: want between %d s (half the settled excess) and %d s (one request's Need)", wait, owedAtLeast, owedAtMost)
			}
			if n := sim.Stats(t).Requests[c.path]; n != before+1 {
				t.Fatalf("the engine got %d requests, want 1", n-before)
			}
		})
	}
}

// Without an engine that fills the context, the settlement's refund repays the owed output at
// once: the next request without an output length passes too (chat and Responses).
func TestTPMOwedOutputRepaidBySettlement(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "131072", "--context-length", "65536")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, owingYAML(sim.URL)))
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"sim","messages":[{"role":"user","content":"hello"}]}`,
		"/v1/responses":        `{"model":"sim","input":"hello"}`,
	}
	for i, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/chat/completions", "/v1/responses"} {
		settledBefore := metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`)
		if r := post(t, gw.URL, path, tenantKey, bodies[path]); r.status != 200 {
			t.Fatalf("request %d on %s after the last one settled: %d %s", i, path, r.status, r.body)
		}
		eventually(t, 10*time.Second, "the request settled", func() bool {
			return metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`) > settledBefore
		})
	}
	// Each reserved the whole context and settled far less: the refunds repaid what was owed.
	if reserved, settled := metric(t, gw.URL, "kvgate_tokens_reserved_total", `tenant="alice"`), metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`); reserved != 4*65536 || settled >= 20000 {
		t.Fatalf("reserved %v (want 4 × 65536), settled %v", reserved, settled)
	}
}

// A request that can never pass at tpm 20000 gets 429 without Retry-After, saying what to change:
// on chat, Messages and Responses, with its output named (over the bucket with it) or, on the
// OpenAI routes, with a prompt that alone is over the bucket. The engine is not called.
func TestTPMNeverPassesWithoutRetryAfter(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "131072", "--context-length", "65536")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, owingYAML(sim.URL)))
	huge := strings.Repeat(" word", 21000) // over 20,000 tokens in any tokenizer the sim counts with
	for _, c := range []struct{ path, body, says string }{
		{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":30000}`, "Lower max_tokens"},
		{"/v1/messages", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":30000}`, "Lower max_tokens"},
		{"/v1/responses", `{"model":"sim","input":"hi","max_output_tokens":30000}`, "Lower max_output_tokens"},
		{"/v1/chat/completions", fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}]}`, huge), "its prompt alone is"},
		{"/v1/responses", fmt.Sprintf(`{"model":"sim","input":%q}`, huge), "its prompt alone is"},
	} {
		before := sim.Stats(t).Requests[c.path]
		r := post(t, gw.URL, c.path, tenantKey, c.body)
		checkNeverOn(t, c.path, r)
		if !strings.Contains(string(r.body), c.says) || !strings.Contains(string(r.body), "raise tpm") {
			t.Fatalf("%s: the 429 should say %q and that tpm could grow: %s", c.path, c.says, r.body)
		}
		if n := sim.Stats(t).Requests[c.path]; n != before {
			t.Fatalf("%s: the engine got %d requests", c.path, n-before)
		}
	}
	// Nothing was charged: a request within the bucket passes at once.
	if r := post(t, gw.URL, "/v1/messages", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":19000}`); r.status != 200 {
		t.Fatalf("max_tokens within tpm after the refusals: %d %s", r.status, r.body)
	}
}
