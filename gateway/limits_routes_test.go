package gateway_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// checkRateLimitedOn asserts a 429 with a Retry-After in the route's envelope: Anthropic's on
// /v1/messages (and count_tokens), OpenAI's elsewhere.
func checkRateLimitedOn(t *testing.T, path string, r reply, typ string) {
	t.Helper()
	if !strings.HasPrefix(path, "/v1/messages") {
		checkRateLimited(t, r, typ)
		return
	}
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if r.status != 429 || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" || e.Error.Message == "" {
		t.Fatalf("%s: want a 429 in Anthropic's envelope, got %d %s", path, r.status, r.body)
	}
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("%s: 429 without a Retry-After: %v", path, r.header)
	}
}

var (
	promptCountRE = regexp.MustCompile(`"(?:prompt_tokens|input_tokens)":\s*(\d+)`)
	outputCountRE = regexp.MustCompile(`"(?:completion_tokens|output_tokens)":\s*(\d+)`)
)

// largest is the largest count re finds in body (counts in streams are cumulative), -1 if none.
func largest(re *regexp.Regexp, body []byte) int64 {
	n := int64(-1)
	for _, m := range re.FindAllSubmatch(body, -1) {
		v, _ := strconv.ParseInt(string(m[1]), 10, 64)
		n = max(n, v)
	}
	return n
}

// tpm 5000 on every generation route, whole and streamed, against the real simulator (which
// generates exactly the tokens asked for and reports usage in each route's own dialect): 30
// back-to-back requests of ~480 tokens each. What the admitted requests used (as the engine
// reported it to the client) never exceeds the limit plus one request's reservation (plus the
// refill of the elapsed time), and what the gateway charged is what was used. Before issue 15,
// /v1/messages and /v1/responses admitted 30 of 30 (their usage was read as nothing).
func TestLimitTPMEveryGenerationRoute(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "16384", "--context-length", "16384")
	const tpm, maxTokens, tries = 5000, 450, 30
	prompt := "Write a long story about a lighthouse keeper and the ships that pass by at night."
	msgs := fmt.Sprintf(`[{"role":"user","content":%q}]`, prompt)
	cases := []struct {
		name, path, body string
		usage            bool // the reply reports usage (else: a chat stream without include_usage)
	}{
		{"chat", "/v1/chat/completions", fmt.Sprintf(`{"model":"sim","messages":%s,"max_tokens":%d}`, msgs, maxTokens), true},
		{"chat stream", "/v1/chat/completions", fmt.Sprintf(`{"model":"sim","messages":%s,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, msgs, maxTokens), true},
		{"chat stream without usage", "/v1/chat/completions", fmt.Sprintf(`{"model":"sim","messages":%s,"max_tokens":%d,"stream":true}`, msgs, maxTokens), false},
		{"completions", "/v1/completions", fmt.Sprintf(`{"model":"sim","prompt":%q,"max_tokens":%d}`, prompt, maxTokens), true},
		{"completions stream", "/v1/completions", fmt.Sprintf(`{"model":"sim","prompt":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, prompt, maxTokens), true},
		{"generate", "/generate", fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":%d}}`, prompt, maxTokens), true},
		{"generate stream", "/generate", fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":%d},"stream":true}`, prompt, maxTokens), true},
		{"responses", "/v1/responses", fmt.Sprintf(`{"model":"sim","input":%q,"max_output_tokens":%d}`, prompt, maxTokens), true},
		{"responses stream", "/v1/responses", fmt.Sprintf(`{"model":"sim","input":%q,"max_output_tokens":%d,"stream":true}`, prompt, maxTokens), true},
		{"messages", "/v1/messages", fmt.Sprintf(`{"model":"sim","messages":%s,"max_tokens":%d}`, msgs, maxTokens), true},
		{"messages stream", "/v1/messages", fmt.Sprintf(`{"model":"sim","messages":%s,"max_tokens":%d,"stream":true}`, msgs, maxTokens), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", fmt.Sprintf("tpm: %d", tpm), "", sim.URL)))
			// The chat stream without usage: its prompt as the engine counts it, from bob (no limits).
			chatPrompt := largest(promptCountRE, post(t, gw.URL, "/v1/chat/completions", "sk-bob",
				fmt.Sprintf(`{"model":"sim","messages":%s,"max_tokens":1}`, msgs)).body)
			start := time.Now()
			var admitted, refused int
			var used, maxReserve int64
			for i := 0; i < tries; i++ {
				r := post(t, gw.URL, c.path, tenantKey, c.body)
				if r.status == 429 {
					checkRateLimitedOn(t, c.path, r, "tokens")
					refused++
					continue
				}
				if r.status != 200 {
					t.Fatalf("request %d: %d %s", i, r.status, r.body)
				}
				admitted++
				reserved, _ := strconv.ParseInt(r.header.Get("X-Kvgate-Tokens"), 10, 64)
				maxReserve = max(maxReserve, reserved+maxTokens)
				p, o := largest(promptCountRE, r.body), largest(outputCountRE, r.body)
				if !c.usage {
					if p >= 0 || o >= 0 {
						t.Fatalf("a stream without include_usage reported usage: %s", r.body)
					}
					p, o = chatPrompt, int64(strings.Count(string(r.body), `"content":"`)-strings.Count(string(r.body), `"content":""`))
				}
				if p <= 0 || o != maxTokens {
					t.Fatalf("request %d: prompt %d, output %d (want %d): %s", i, p, o, maxTokens, r.body)
				}
				used += p + o
			}
			refill := int64(time.Since(start).Seconds()*tpm/60) + 1
			t.Logf("%s: admitted %d of %d, used %d tokens (tpm %d, one reservation %d, refill %d)", c.name, admitted, tries, used, tpm, maxReserve, refill)
			if refused == 0 || admitted == 0 {
				t.Fatalf("admitted %d, refused %d: tpm not exercised", admitted, refused)
			}
			if used > tpm+maxReserve+refill {
				t.Fatalf("admitted %d requests using %d tokens at tpm %d (one reservation %d, refill %d)", admitted, used, tpm, maxReserve, refill)
			}
			// What was charged: the usage exactly (a chat stream whose client did not ask for
			// usage too: the gateway asked the engine for it and kept it from the client).
			settled := func() int64 { return int64(metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`)) }
			want := float64(tries) // an exchange is counted once settled (finish)
			if c.path == "/v1/chat/completions" {
				want++ // bob's
			}
			eventually(t, 2*time.Second, "every admitted reply settled", func() bool {
				return metric(t, gw.URL, "kvgate_requests_total", `route="`+c.path+`"`) == want
			})
			if s := settled(); s != used {
				t.Fatalf("charged %d tokens for %d used", s, used)
			}
		})
	}
}
