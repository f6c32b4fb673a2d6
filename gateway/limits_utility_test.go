package gateway_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// The utility routes send the client's bytes to an engine, so they are under the tenant's
// limits like the generation routes. At rpm 2, of 5 calls 2 are answered and 3 get a 429 in the
// route's envelope with a Retry-After, and the engine sees only the 2 (before issue 15: 20 of
// 20 answered at rpm 2). Another tenant is not affected.
func TestLimitUtilityRoutesRPM(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	msgs := `[{"role":"user","content":"how many tokens is this?"}]`
	for _, c := range []struct{ path, body string }{
		{"/tokenize", `{"model":"sim","prompt":"count these words"}`},
		{"/v1/tokenize", `{"model":"sim","prompt":"count these words"}`},
		{"/detokenize", `{"model":"sim","tokens":[1,2,3]}`},
		{"/v1/detokenize", `{"model":"sim","tokens":[1,2,3]}`},
		{"/v1/messages/count_tokens", `{"model":"sim","messages":` + msgs + `}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML(testRedisURL(), uniquePrefix(t), "rpm: 2", "", sim.URL)))
			seen := func() int {
				st := sim.Stats(t)
				if strings.HasSuffix(c.path, "/tokenize") {
					return st.TokenizeRequests
				}
				return st.Requests[c.path]
			}
			if r := post(t, gw.URL, c.path, "sk-bob", c.body); r.status != 200 {
				t.Fatalf("bob (no limits): %d %s", r.status, r.body)
			}
			// The gateway's own calibration calls /tokenize too: start counting once it is done.
			last := -1
			eventually(t, 5*time.Second, "the engine's counts settle", func() bool {
				n := seen()
				stable := n == last
				last = n
				time.Sleep(100 * time.Millisecond)
				return stable
			})
			before := seen()
			codes := map[int]int{}
			for i := 0; i < 5; i++ {
				r := post(t, gw.URL, c.path, tenantKey, c.body)
				if r.status == 429 {
					checkRateLimitedOn(t, c.path, r, "requests")
				}
				codes[r.status]++
			}
			if codes[200] != 2 || codes[429] != 3 {
				t.Fatalf("rpm 2 on %s: %v", c.path, codes)
			}
			if got := seen() - before; got != 2 {
				t.Fatalf("the engine saw %d of alice's calls; only the 2 admitted may reach it", got)
			}
			if n := metric(t, gw.URL, "kvgate_ratelimited_total", `tenant="alice"`, `limit="rpm"`); n != 3 {
				t.Fatalf("kvgate_ratelimited_total{limit=rpm} = %v", n)
			}
			if r := post(t, gw.URL, c.path, "sk-bob", c.body); r.status != 200 {
				t.Fatalf("bob after alice's refusals: %d %s", r.status, r.body)
			}
		})
	}
}

// A utility call's prompt counts against tpm: reserved by its byte bound, settled by the
// engine's own count, so tokenizing is charged what it tokenized and refused once the minute's
// tokens are spent.
func TestLimitUtilityRoutesTPM(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "tpm: 1000", "", sim.URL)))
	body := fmt.Sprintf(`{"model":"sim","prompt":%q}`, words(120))
	var counted int64
	admitted, refused := 0, 0
	for i := 0; i < 20 && refused == 0; i++ {
		r := post(t, gw.URL, "/v1/tokenize", tenantKey, body)
		if r.status == 429 {
			checkRateLimited(t, r, "tokens")
			refused++
			continue
		}
		var out struct {
			Count int64 `json:"count"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &out) != nil || out.Count <= 0 {
			t.Fatalf("tokenize: %d %s", r.status, r.body)
		}
		counted += out.Count
		admitted++
	}
	if refused == 0 || admitted < 2 {
		t.Fatalf("tpm 1000: %d admitted, %d refused", admitted, refused)
	}
	if s := metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`); int64(s) != counted {
		t.Fatalf("charged %v tokens for %d tokenized", s, counted)
	}
	// Within the limit plus one reservation (the refill of a second is a few tokens).
	if counted > 1000+int64(len(body)) {
		t.Fatalf("%d tokens admitted at tpm 1000 (one reservation %d)", counted, len(body))
	}
	t.Logf("tpm 1000, /v1/tokenize of %d bytes: admitted %d, %d tokens charged", len(body), admitted, counted)
}

// max_concurrent 1 holds on a utility route: while one tokenize call waits on the engine, a
// second is refused (429) without reaching it; once the first is answered, the slot is free.
func TestLimitUtilityRoutesMaxConcurrent(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/server_info":
			ctx.SetBodyString(`{"max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":16,"disaggregation_mode":"null"}`)
		case "/v1/models":
			ctx.SetBodyString(`{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`)
		case "/v1/tokenize":
			if calls.Add(1) == 1 {
				<-release // the first call waits until the test lets it go
			}
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"tokens":[1,2],"count":2,"max_model_len":8192}`)
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "max_concurrent: 1", "", "http://"+ln.Addr().String())))
	body := `{"model":"sim","prompt":"hi"}`
	first := make(chan reply, 1)
	go func() { first <- post(t, gw.URL, "/v1/tokenize", tenantKey, body) }()
	eventually(t, 5*time.Second, "the first call reached the engine", func() bool { return calls.Load() == 1 })
	checkRateLimited(t, post(t, gw.URL, "/v1/tokenize", tenantKey, body), "requests")
	if n := calls.Load(); n != 1 {
		t.Fatalf("the refused call reached the engine (%d calls)", n)
	}
	close(release)
	if r := <-first; r.status != 200 {
		t.Fatalf("the first call: %d %s", r.status, r.body)
	}
	eventually(t, 2*time.Second, "the slot is free once the first call is answered", func() bool {
		return post(t, gw.URL, "/v1/tokenize", tenantKey, body).status == 200
	})
}
