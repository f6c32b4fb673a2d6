package gateway_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// OpenAI's x-ratelimit-* headers, over two replicas sharing Redis: the limit, what remains of it
// after this request (counted across both replicas), and when the cell is empty again, in Go's
// duration format as OpenAI writes it ("1s", "6m0s"). A 429 carries them too; a tenant without
// limits gets none.
func TestRateLimitHeaders(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gws := twoReplicas(t, limitsYAML(testRedisURL(), uniquePrefix(t), "rpm: 3, tpm: 100000", "", sim.URL))
	var last reply
	for i := 0; i < 3; i++ {
		last = post(t, gws[i%2].URL, "/v1/chat/completions", tenantKey, smallChat)
		if last.status != 200 {
			t.Fatalf("request %d: %d %s", i, last.status, last.body)
		}
		h := last.header
		if h.Get("x-ratelimit-limit-requests") != "3" || h.Get("x-ratelimit-remaining-requests") != strconv.Itoa(2-i) {
			t.Fatalf("request %d: requests headers %v", i, h)
		}
		// The cell holds (i+1) requests of 20 s each (rpm 3); a few ms pass between requests.
		reset, err := time.ParseDuration(h.Get("x-ratelimit-reset-requests"))
		if want := time.Duration(i+1) * 20 * time.Second; err != nil || reset > want || reset < want-5*time.Second {
			t.Fatalf("request %d: x-ratelimit-reset-requests %q, want about %s", i, h.Get("x-ratelimit-reset-requests"), want)
		}
		if h.Get("x-ratelimit-limit-tokens") != "100000" {
			t.Fatalf("request %d: tokens headers %v", i, h)
		}
		// The reservation (prompt count + max_tokens 4) was charged; settlement may refund later.
		rem, err := strconv.Atoi(h.Get("x-ratelimit-remaining-tokens"))
		reserved, _ := strconv.Atoi(h.Get("X-Kvgate-Tokens"))
		if err != nil || rem >= 100000-reserved || rem < 100000-3*(reserved+4)-10 {
			t.Fatalf("request %d: x-ratelimit-remaining-tokens %q (reserved %d)", i, h.Get("x-ratelimit-remaining-tokens"), reserved)
		}
		if d, err := time.ParseDuration(h.Get("x-ratelimit-reset-tokens")); err != nil || d <= 0 || d > time.Minute {
			t.Fatalf("request %d: x-ratelimit-reset-tokens %q", i, h.Get("x-ratelimit-reset-tokens"))
		}
	}
	if last.header.Get("x-ratelimit-reset-requests") == "" || last.header.Get("x-ratelimit-reset-requests")[len(last.header.Get("x-ratelimit-reset-requests"))-1] != 's' {
		t.Fatalf("reset not in OpenAI's format: %q", last.header.Get("x-ratelimit-reset-requests"))
	}
	r := post(t, gws[1].URL, "/v1/chat/completions", tenantKey, smallChat)
	checkRateLimited(t, r, "requests")
	if r.header.Get("x-ratelimit-remaining-requests") != "0" || r.header.Get("x-ratelimit-limit-requests") != "3" {
		t.Fatalf("429 headers: %v", r.header)
	}
	// The utility routes reserve against the same limits, and say so the same way.
	if r := post(t, gws[0].URL, "/v1/tokenize", tenantKey, `{"model":"sim","prompt":"hi"}`); r.status != 429 || r.header.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("tokenize over the limit: %d %v", r.status, r.header)
	}
	if r := post(t, gws[0].URL, "/v1/chat/completions", "sk-bob", smallChat); r.status != 200 || r.header.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("bob has no limits and gets no rate-limit headers: %d %v", r.status, r.header)
	}
}

// policy.overflow_status: 400 for clients that only treat OpenAI's 400 as context_length_exceeded;
// the envelope is otherwise the same, on every route's shape.
func TestOverflowStatus400(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "2048", "--context-length", "4096")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "rpm: 100", "policy: {overflow_status: 400}\n", sim.URL)))
	huge := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":4}`, words(5000))
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, huge)
	if r.status != 400 || decodeError(t, r).Error.Code != "context_length_exceeded" {
		t.Fatalf("want 400 context_length_exceeded, got %d %s", r.status, r.body)
	}
	msgs := fmt.Sprintf(`{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":%q}]}`, words(5000))
	if r := post(t, gw.URL, "/v1/messages", tenantKey, msgs); r.status != 400 || !containsAll(string(r.body), `"type":"error"`, `"invalid_request_error"`) {
		t.Fatalf("anthropic route: want 400 invalid_request_error, got %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 200 {
		t.Fatalf("a prompt that fits: %d %s", r.status, r.body)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
