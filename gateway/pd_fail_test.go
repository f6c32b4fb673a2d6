package gateway_test

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// fakePrefill reports itself as a healthy prefill engine whose bootstrap port accepts and never
// answers (a decode pulling its KV from it waits), and answers generation requests with gen.
func fakePrefill(t *testing.T, gen fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	boot, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := boot.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		boot.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	info := `{"max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":16,"disaggregation_mode":"prefill","disaggregation_bootstrap_port":` +
		strconv.Itoa(boot.Addr().(*net.TCPAddr).Port) + `}`
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/server_info":
			ctx.SetBodyString(info)
		case "/v1/models":
			ctx.SetBodyString(`{"object":"list","data":[{"id":"sim","max_model_len":16384}]}`)
		case "/generate", "/v1/chat/completions":
			gen(ctx)
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// brokenPrefill fails every generation request, once by closing the connection, then with a 500.
func brokenPrefill(t *testing.T) (url string, calls *atomic.Int32) {
	calls = &atomic.Int32{}
	url = fakePrefill(t, func(ctx *fasthttp.RequestCtx) {
		if calls.Add(1) == 1 {
			_ = ctx.Conn().Close() // a transport error: no response at all
			return
		}
		ctx.SetStatusCode(500)
		ctx.SetBodyString(`{"error":{"message":"prefill exploded"}}`)
	})
	return url, calls
}

// A failing prefill leg fails the request at once (decode is aborted instead of waiting out its
// transfer timeout), after one retry with a new room; decode's pages all come back.
func TestFailingPrefillLegCancelsDecode(t *testing.T) {
	decode := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "16384", "--context-length", "16384", "--page-size", "16", "--transfer-timeout", "20s")
	purl, calls := brokenPrefill(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"p", purl, "prefill"}, [3]string{"d", decode.URL, "decode"})))
	total := decode.Stats(t).Pool.PagesTotal
	start := time.Now()
	r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hello there","sampling_params":{"max_new_tokens":4}}`)
	took := time.Since(start)
	if r.status != 500 || !strings.Contains(string(r.body), "prefill exploded") {
		t.Fatalf("want the prefill failure reported, got %d %s", r.status, r.body)
	}
	if took > 5*time.Second {
		t.Fatalf("took %s: decode was not cancelled (its transfer timeout is 20 s)\n%s", took, decode.Output())
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("want one retry after the transport error (2 prefill calls), got %d", n)
	}
	deadline := time.Now().Add(3 * time.Second)
	for decode.Stats(t).Pool.PagesFree != total {
		if time.Now().After(deadline) {
			t.Fatalf("decode still holds pages: %d of %d free", decode.Stats(t).Pool.PagesFree, total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("failed in %s with %d %s", took, r.status, r.body)
}

// A prefill error that quotes another tenant's marker is a leak like any reply: 502, incident,
// quarantine.
func TestPrefillErrorWithForeignMarkerIsALeak(t *testing.T) {
	bob := markerFor(t, "test-secret-of-at-least-32-bytes", "b")
	purl := fakePrefill(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(400)
		ctx.SetBodyString(`{"error":{"message":"cannot parse: ` + bob + `"}}`)
	})
	decode := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "16384", "--context-length", "16384", "--page-size", "16", "--transfer-timeout", "20s")
	prefix := uniquePrefix(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, canaryYAML(prefix, "enforce",
		[3]string{"p", purl, "prefill"}, [3]string{"d", decode.URL, "decode"})))
	r := post(t, gw.URL, "/generate", "sk-a", `{"text":"hello","sampling_params":{"max_new_tokens":2}}`)
	if r.status != 502 || decodeError(t, r).Error.Code != "upstream_integrity" || strings.Contains(string(r.body), "KVG-") {
		t.Fatalf("want 502 upstream_integrity, got %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		a := get(t, gw.URL+"/admin/incidents", "admin-key")
		b := get(t, gw.URL+"/admin/backends", "admin-key")
		if strings.Contains(string(a.body), `"kind":"leak"`) && strings.Count(string(b.body), "quarantined_until") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no incident or quarantine: %s %s", a.body, b.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
