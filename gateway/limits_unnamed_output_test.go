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

// A tenant whose tpm is smaller than the context cannot send a request that names no output
// length: it could settle more than the whole limit. The 429 says why and how to fix it, and the
// engine is not called.
func TestNoMaxTokensOverTPMIsRefusedUpFront(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--fill-context")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "tpm: 3000", "", sim.URL)))
	before := sim.Stats(t).Requests["/v1/chat/completions"]
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello"}]}`)
	checkRateLimited(t, r, "tokens")
	if !strings.Contains(string(r.body), "Request too large") || !strings.Contains(string(r.body), "max_tokens") {
		t.Fatalf("the 429 should say the request alone exceeds the limit: %s", r.body)
	}
	if n := sim.Stats(t).Requests["/v1/chat/completions"]; n != before {
		t.Fatalf("the engine got %d requests", n-before)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":8}`); r.status != 200 {
		t.Fatalf("with max_tokens: %d %s", r.status, r.body)
	}
}
