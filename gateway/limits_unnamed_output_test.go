package gateway_test

import (
	"fmt"
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

// A tenant whose tpm is smaller than the context may still send a request that names no output
// length when its prompt fits (issue 37: it was a 429 before): the unnamed output is owed. The
// engine fills the context (--fill-context), so the request settles 8,191 tokens against a
// 3,000-token minute: the next request waits for the debt, with a Retry-After.
func TestNoMaxTokensOverTPMOwesItsOutput(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--fill-context")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "tpm: 3000", "", sim.URL)))
	before := sim.Stats(t).Requests["/v1/chat/completions"]
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello"}]}`); r.status != 200 {
		t.Fatalf("no max_tokens, the prompt within tpm: %d %s", r.status, r.body)
	}
	eventually(t, 10*time.Second, "the request settled", func() bool {
		return metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`) > 3000
	})
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`)
	checkRateLimited(t, r, "tokens")
	if n := sim.Stats(t).Requests["/v1/chat/completions"]; n != before+1 {
		t.Fatalf("the engine got %d requests, want 1", n-before)
	}
}
