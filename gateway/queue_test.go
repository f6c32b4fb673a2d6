package gateway_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/testkit"
)

// queueEngine is a unified engine with an 8192-token pool that reports nothing in use (so the
// free KV is what the gateway has dispatched) and holds every completion until the test
// releases it.
type queueEngine struct {
	url     string
	arrived atomic.Int32
	mu      sync.Mutex
	bodies  []string
	held    chan chan struct{}
	noLoads bool
	stop    chan struct{}
}

func newQueueEngine(t *testing.T, noLoads bool) *queueEngine {
	e := &queueEngine{held: make(chan chan struct{}, 16), noLoads: noLoads, stop: make(chan struct{})}
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
		case "/v1/loads":
			if e.noLoads {
				ctx.SetStatusCode(404)
				return
			}
			ctx.SetBodyString(`{"dp_rank_count":1,"loads":[{"dp_rank":0,"num_used_tokens":0}]}`)
		case "/v1/completions":
			e.mu.Lock()
			e.bodies = append(e.bodies, string(ctx.PostBody()))
			e.mu.Unlock()
			e.arrived.Add(1)
			release := make(chan struct{})
			e.held <- release
			select {
			case <-release:
			case <-e.stop: // the test ended (or failed) with requests held
			}
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"c","object":"text_completion","model":"sim","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	t.Cleanup(func() { close(e.stop) }) // runs first: held handlers return, so Shutdown does not wait on them
	e.url = "http://" + ln.Addr().String()
	return e
}

func queueGateway(t *testing.T, e *queueEngine, queue string) *testkit.Gateway {
	// The admin key opens /metrics (metrics_auth: key by default), which the tests read.
	return testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf(`backends: [{name: eng, url: %q, role: unified}]
admin_key_sha256: %q
tenants:
  - {name: alice, key_sha256: %q}
  - {name: bob, key_sha256: %q, weight: 2}
capacity: {poll_interval: 100ms}
queue: {enabled: true, %s}
`, e.url, testkit.KeySHA256("admin-key"), testkit.KeySHA256("alice-key"), testkit.KeySHA256("bob-key"), queue)))
}

// 5000 tokens of reserved output: two never fit the 8192-token pool together.
const bigCompletion = `{"model":"sim","prompt":"hi","max_tokens":5000}`

// A request that fits the pool but not its free KV waits, reaches the engine only when the one
// before it finishes, and says how long it waited; the queue's bound answers 503 at once.
func TestQueueWaitsForFreeKV(t *testing.T) {
	e := newQueueEngine(t, false)
	gw := queueGateway(t, e, "max_queued: 1, timeout: 1m")
	first, second := make(chan reply, 1), make(chan reply, 1)
	go func() { first <- post(t, gw.URL, "/v1/completions", "alice-key", bigCompletion) }()
	r1 := <-e.held
	go func() { second <- post(t, gw.URL, "/v1/completions", "bob-key", bigCompletion) }()
	eventually(t, 5*time.Second, "the second request is queued", func() bool { return metric(t, gw.URL, "kvgate_queue_length") == 1 })
	if full := post(t, gw.URL, "/v1/completions", "alice-key", bigCompletion); full.status != 503 || !strings.Contains(string(full.body), "queue_full") {
		t.Fatalf("over max_queued: %d %s, want 503 queue_full", full.status, full.body)
	}
	if n := e.arrived.Load(); n != 1 {
		t.Fatalf("%d requests reached the engine while its free KV held one", n)
	}
	close(r1)
	if r := <-first; r.status != 200 || r.header.Get("X-Kvgate-Queue-Ms") != "" {
		t.Fatalf("first: %d, queue-ms %q (it never waited)", r.status, r.header.Get("X-Kvgate-Queue-Ms"))
	}
	close(<-e.held) // the second reached the engine once the first freed its KV
	r := <-second
	if r.status != 200 || r.header.Get("X-Kvgate-Queue-Ms") == "" {
		t.Fatalf("second: %d %s, queue-ms %q", r.status, r.body, r.header.Get("X-Kvgate-Queue-Ms"))
	}
	if n := gw.Set.Get("eng").Reserved(); n != 0 {
		t.Fatalf("reservation left after both finished: %d", n)
	}
	if n := metric(t, gw.URL, "kvgate_queue_wait_seconds_count", `tenant="bob"`); n != 1 {
		t.Fatalf("kvgate_queue_wait_seconds_count{tenant=bob} = %v, want 1", n)
	}
}

// A queued client that disconnects leaves the queue at once, is charged nothing, and its request
// never reaches the engine.
func TestQueueClientGoneLeavesUncharged(t *testing.T) {
	e := newQueueEngine(t, false)
	gw := queueGateway(t, e, "timeout: 1m")
	first := make(chan reply, 1)
	go func() { first <- post(t, gw.URL, "/v1/completions", "alice-key", bigCompletion) }()
	r1 := <-e.held
	c, err := net.Dial("tcp", gw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bob-key\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(bigCompletion), bigCompletion)
	eventually(t, 5*time.Second, "bob's request is queued", func() bool { return metric(t, gw.URL, "kvgate_queue_length", `tenant="bob"`) == 1 })
	c.Close()
	// Leaving is seen while alice's request still holds the KV: no dispatch is needed to notice.
	eventually(t, 5*time.Second, "bob's request leaves the queue when its client goes", func() bool { return metric(t, gw.URL, "kvgate_queue_length") == 0 })
	close(r1)
	<-first
	// A request from alice now runs at once: nothing of bob's went ahead of it.
	third := make(chan reply, 1)
	go func() { third <- post(t, gw.URL, "/v1/completions", "alice-key", bigCompletion) }()
	close(<-e.held)
	<-third
	e.mu.Lock()
	n := len(e.bodies)
	e.mu.Unlock()
	if n != 2 {
		t.Fatalf("engine saw %d requests, want alice's 2 (bob's left before dispatch)", n)
	}
}

// Past queue.timeout the client gets 429 with Retry-After in the route's envelope; an engine
// that reports no usage fails closed (nothing is dispatched on a guess).
func TestQueueTimeoutAndUnknownUsage(t *testing.T) {
	e := newQueueEngine(t, true)
	gw := queueGateway(t, e, "timeout: 300ms")
	r := post(t, gw.URL, "/v1/completions", "alice-key", bigCompletion)
	if r.status != 429 || r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), `"code":"queue_timeout"`) ||
		!strings.Contains(string(r.body), `"type":"rate_limit_error"`) {
		t.Fatalf("timed out: %d %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if n := e.arrived.Load(); n != 0 {
		t.Fatalf("%d requests reached an engine whose usage is unknown", n)
	}
	m := post(t, gw.URL, "/v1/messages", "alice-key", `{"model":"sim","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`)
	if m.status != 429 || !strings.Contains(string(m.body), `"type":"error"`) {
		t.Fatalf("messages route: %d %s, want 429 in Anthropic's envelope", m.status, m.body)
	}
}
