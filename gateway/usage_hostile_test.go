package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/testkit"
)

// An engine's usage numbers are untrusted. Before issue 15 a negative prompt_tokens panicked in
// limit settlement (a Prometheus counter given a negative delta) and the process exited: every
// tenant lost the gateway. Each hostile reading here, whole and streamed, must leave the request
// answered and the gateway serving, and must never refund more than was reserved.
func TestHostileUsageNeverCrashesOrRefunds(t *testing.T) {
	readings := []string{
		`{"prompt_tokens":-100000000,"completion_tokens":5,"total_tokens":-99999995}`,
		`{"prompt_tokens":5,"completion_tokens":-100000000}`,
		`{"prompt_tokens":1e9,"completion_tokens":1.5}`,
		`{"prompt_tokens":99999999999999999999999,"completion_tokens":1}`,
		`{"prompt_tokens":"12","completion_tokens":null}`,
		`{"prompt_tokens":-9223372036854775808,"completion_tokens":-9223372036854775808}`,
		`[1,2,3]`,
	}
	var current string
	url := fakeUnified(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("text/event-stream")
			fmt.Fprintf(ctx, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
			fmt.Fprintf(ctx, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", current)
			return
		}
		fmt.Fprintf(ctx, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":%s}`, current)
	})
	// tpm 2000 with 1000-token reservations: two requests fit a minute. A reading that refunded
	// (negative usage) would let more through.
	yaml := fmt.Sprintf(`backends: [{name: eng, url: %q, role: unified}]
tenants:
  - {name: bob, key_sha256: %q, tpm: 2000, rpm: 1000, max_concurrent: 4}
  - {name: carol, key_sha256: %q}
capacity: {poll_interval: 100ms}
`, url, testkit.KeySHA256("bob-key"), testkit.KeySHA256("carol-key"))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	body := func(stream bool) string {
		return fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":990,"stream":%v}`, stream)
	}
	panicsBefore := metric(t, gw.URL, "kvgate_panics_total") // process-wide: other tests' panics count too
	admitted := 0
	for _, u := range readings {
		current = u
		for _, stream := range []bool{false, true} {
			r := post(t, gw.URL, "/v1/chat/completions", "bob-key", body(stream))
			switch r.status {
			case 200:
				admitted++
			case 429:
			default:
				t.Fatalf("usage %s (stream %v): %d %s", u, stream, r.status, r.body)
			}
			// Another tenant is served whatever bob's engine said.
			if c := post(t, gw.URL, "/v1/chat/completions", "carol-key", body(stream)); c.status != 200 {
				t.Fatalf("after usage %s: carol got %d %s", u, c.status, c.body)
			}
		}
	}
	if admitted > 3 {
		t.Fatalf("%d of %d requests of ~1000 tokens admitted at tpm 2000: hostile usage refunded the reservation", admitted, 2*len(readings))
	}
	if admitted == 0 {
		t.Fatal("no request admitted at all: the test did not exercise settlement")
	}
	if n := metric(t, gw.URL, "kvgate_panics_total") - panicsBefore; n != 0 {
		t.Fatalf("kvgate_panics_total rose by %v: settlement should not panic at all", n)
	}
}
