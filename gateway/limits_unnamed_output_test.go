package gateway_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Issue 31: with no max_tokens and the shipped policy.default_max_tokens: 0, a request reserved
// only its prompt, so a tenant at tpm 3000 settled 13–27 times its limit in one burst. An engine
// that is told no output length generates until its context is full (the simulator with
// --fill-context, like SGLang's scheduler): a burst of such requests must settle within the
// limit, plus the refill while it ran, plus one request.
func TestBurstWithoutMaxTokensSettlesWithinTPM(t *testing.T) {
	const ctxLen, tpm, burst = 1024, 3000, 12
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", fmt.Sprint(ctxLen), "--fill-context")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", fmt.Sprintf("tpm: %d", tpm), "", sim.URL)))
	start := time.Now()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < burst; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream := ""
			if i%2 == 1 {
				stream = `,"stream":true`
			}
			r := post(t, gw.URL, "/v1/chat/completions", tenantKey,
				fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"write a long story, number %d"}]%s}`, i, stream))
			if r.status == 429 {
				checkRateLimited(t, r, "tokens")
			} else if r.status != 200 {
				t.Errorf("request %d: %d %s", i, r.status, r.body)
			}
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	if codes[200] == 0 {
		t.Fatalf("nothing admitted: %v", codes)
	}
	// The engine did produce long outputs: each admitted request settles most of the context.
	var settled float64
	eventually(t, 10*time.Second, "every admitted request settled most of the context", func() bool {
		settled = metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`)
		return settled >= float64(codes[200])*ctxLen/2
	})
	refill := elapsed.Seconds() * tpm / 60
	if bound := tpm + refill + ctxLen; settled > bound {
		t.Fatalf("a burst of %d requests without max_tokens settled %.0f tokens: more than tpm %d + refill %.0f + one request (%d); codes %v",
			burst, settled, tpm, refill, ctxLen, codes)
	}
	t.Logf("codes %v, settled %.0f tokens in %s (tpm %d)", codes, settled, elapsed.Round(time.Millisecond), tpm)
}

// A tenant whose tpm holds a typical request (20,000 on a 65,536-token context) can send a
// request that names no output length, on chat, Messages and Responses: the output it did not
// bound is owed to its tpm, not refused up front (issue 37; it got 429 with Retry-After: 60 every
// time). A request whose own bounded part can never fit gets 429 without Retry-After, saying what
// to change, and no engine sees it.
func TestNoMaxTokensUnderTPMIsServed(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "131072", "--context-length", "65536")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "tpm: 20000", "", sim.URL)))
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hello"}]}`},
		// Anthropic's Messages requires max_tokens: its SDK's usual 4096 is within the limit.
		{"/v1/messages", `{"model":"sim","max_tokens":4096,"messages":[{"role":"user","content":"hello"}]}`},
		{"/v1/responses", `{"model":"sim","input":"hello"}`},
	} {
		if r := post(t, gw.URL, c.path, tenantKey, c.body); r.status != 200 {
			t.Fatalf("%s without max_tokens under tpm 20000: %d %s", c.path, r.status, r.body)
		}
	}
	before := sim.Stats(t).Requests["/v1/chat/completions"]
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":30000}`)
	checkNeverPasses(t, r)
	if n := sim.Stats(t).Requests["/v1/chat/completions"]; n != before {
		t.Fatalf("the engine got %d requests", n-before)
	}
}

// checkNeverPasses: a 429 on tokens that waiting cannot cure has no Retry-After and says what to
// change (max_tokens, or the limit).
func checkNeverPasses(t *testing.T, r reply) {
	t.Helper()
	if r.status != 429 {
		t.Fatalf("want 429, got %d %s", r.status, r.body)
	}
	e := decodeError(t, r)
	if e.Error.Type != "tokens" || e.Error.Code != "rate_limit_exceeded" || r.header.Get("Retry-After") != "" ||
		!strings.Contains(string(r.body), "max_tokens") || !strings.Contains(string(r.body), "larger tpm") {
		t.Fatalf("a request that can never pass: %v %s", r.header, r.body)
	}
}
