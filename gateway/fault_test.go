package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Faults on loopback: engines that die, stall, lie about or hide their capacity, refuse
// connections. Each test bounds how long the client waits and checks what it was told.

// streamAll sends a streaming request and reads the whole reply, failing if it takes longer
// than within (a hang).
func streamAll(t *testing.T, url, path, body string, within time.Duration) (int, []byte, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	c := &http.Client{Timeout: within}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("request: %v (after %s)", err, time.Since(start))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the reply: %v after %s (a hang, or a body cut without an error event): %.300q", err, time.Since(start), b)
	}
	return resp.StatusCode, b, time.Since(start)
}

// A backend killed mid-stream: the client gets an error event promptly, never a stream that
// looks finished (no finish_reason "stop"/"length" after the cut, an upstream_error event).
func TestFaultBackendKilledMidStream(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", "100ms")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	for _, c := range []struct{ path, body string }{
		{"/generate", `{"text":"tell me everything","sampling_params":{"max_new_tokens":200},"stream":true}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"tell me everything"}],"max_tokens":200,"stream":true}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			if c.path != "/generate" {
				sim.Restart(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", "100ms")
				eventually(t, 5*time.Second, "gateway sees the restarted engine", func() bool {
					return post(t, gw.URL, "/generate", tenantKey, `{"text":"x","sampling_params":{"max_new_tokens":1}}`).status == 200
				})
			}
			req, _ := http.NewRequest("POST", gw.URL+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer "+tenantKey)
			resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("stream: %v %v", err, resp)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			var got bytes.Buffer
			for i := 0; i < 3; i++ { // a few events arrived: generation is under way
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				got.WriteString(line)
			}
			killed := time.Now()
			sim.Stop()
			rest, err := io.ReadAll(br)
			took := time.Since(killed)
			if err != nil {
				t.Fatalf("the client's read failed after the kill (%v, %s) instead of ending with an error event", err, took)
			}
			got.Write(rest)
			if took > 5*time.Second {
				t.Fatalf("the stream took %s to end after the engine died", took)
			}
			events := dataLines(got.Bytes())
			last := events[len(events)-1]
			if last == "[DONE]" && len(events) > 1 {
				last = events[len(events)-2]
			}
			if !strings.Contains(last, `"upstream_error"`) {
				t.Fatalf("the stream ended without an error event: %q", events)
			}
			for _, e := range events {
				if strings.Contains(e, `"finish_reason":"stop"`) || strings.Contains(e, `"finish_reason":"length"`) || strings.Contains(e, `"type":"length"`) {
					t.Fatalf("a cut stream presented as finished: %s", e)
				}
				if strings.Contains(e, sim.Addr) {
					t.Fatalf("the error event names the backend: %s", e)
				}
			}
			t.Logf("error event %s after the kill", took.Round(time.Millisecond))
		})
	}
}

// switchable is a fake unified engine whose capacity endpoints and generation replies a test
// changes while the gateway runs.
type switchable struct {
	mu        sync.Mutex
	info      func(ctx *fasthttp.RequestCtx) // /server_info
	models    func(ctx *fasthttp.RequestCtx) // /v1/models
	gen       func(ctx *fasthttp.RequestCtx)
	genCalls  atomic.Int32
	ln        net.Listener
	srv       *fasthttp.Server
	addr, url string
}

func infoJSON(pool int) func(*fasthttp.RequestCtx) {
	return func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"max_total_num_tokens":%d,"max_req_input_len":%d,"page_size":16,"disaggregation_mode":"null"}`, pool, pool-6)
	}
}

func modelsJSON(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`)
}

func okGenerate(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"text":"ok","meta_info":{"id":"x","prompt_tokens":1,"completion_tokens":1,"finish_reason":{"type":"length","length":1}}}`)
}

func newSwitchable(t *testing.T) *switchable {
	s := &switchable{info: infoJSON(4096), models: modelsJSON, gen: okGenerate}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln, s.addr, s.url = ln, ln.Addr().String(), "http://"+ln.Addr().String()
	s.srv = &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		s.mu.Lock()
		info, models, gen := s.info, s.models, s.gen
		s.mu.Unlock()
		switch string(ctx.Path()) {
		case "/server_info", "/get_server_info":
			info(ctx)
		case "/v1/models":
			models(ctx)
		case "/generate", "/v1/chat/completions", "/v1/completions":
			s.genCalls.Add(1)
			gen(ctx)
		case "/abort_request":
			ctx.SetBodyString(`{}`)
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(func() { _ = s.srv.Shutdown() })
	return s
}

func (s *switchable) set(f func(s *switchable)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// withCapacity replaces gatewayYAML's capacity section.
func withCapacity(yaml, capacity string) string {
	return strings.Replace(yaml, "capacity: {poll_interval: 200ms}\n", "capacity: "+capacity+"\n", 1)
}

// A capacity endpoint that answers garbage, 404, a smaller pool, or hangs: the gateway fails
// closed (503 capacity_unknown or a lower limit, nothing forwarded it could not check) and serves
// again once the endpoint heals.
func TestFaultCapacityEndpoint(t *testing.T) {
	eng := newSwitchable(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, withCapacity(gatewayYAML("", [3]string{"eng", eng.url, "unified"}), "{poll_interval: 100ms, max_age: 300ms, timeout: 200ms}")))
	small := `{"text":"hi","sampling_params":{"max_new_tokens":1}}`
	mid := `{"input_ids":[` + strings.TrimSuffix(strings.Repeat("5,", 3000), ",") + `],"sampling_params":{"max_new_tokens":1}}`
	healthyNow := func() {
		t.Helper()
		eng.set(func(s *switchable) { s.info, s.models = infoJSON(4096), modelsJSON })
		eventually(t, 3*time.Second, "the gateway serves again after the endpoint healed", func() bool {
			return post(t, gw.URL, "/generate", tenantKey, mid).status == 200
		})
	}
	healthyNow()
	hang := make(chan struct{})
	defer close(hang)
	for _, c := range []struct {
		name string
		set  func(s *switchable)
	}{
		{"garbage server_info", func(s *switchable) { s.info = func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("<html>oops") } }},
		{"truncated server_info", func(s *switchable) {
			s.info = func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"max_total_num_tokens":40`) }
		}},
		{"wrong types", func(s *switchable) {
			s.info = func(ctx *fasthttp.RequestCtx) {
				ctx.SetBodyString(`{"max_total_num_tokens":"big","max_req_input_len":null}`)
			}
		}},
		{"server_info 404", func(s *switchable) { s.info = func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(404) } }},
		{"server_info 500", func(s *switchable) { s.info = func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(500) } }},
		{"models 404", func(s *switchable) { s.models = func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(404) } }},
		{"models without max_model_len", func(s *switchable) {
			s.models = func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"data":[{"id":"sim"}]}`) }
		}},
		{"server_info hangs", func(s *switchable) {
			s.info = func(ctx *fasthttp.RequestCtx) {
				select {
				case <-hang:
				case <-time.After(5 * time.Second):
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng.set(c.set)
			before := eng.genCalls.Load()
			defer healthyNow()
			eventually(t, 3*time.Second, "503 once the last good reading is older than max_age", func() bool {
				r := post(t, gw.URL, "/generate", tenantKey, small)
				if r.status == 200 {
					return false
				}
				e := decodeError(t, r)
				if r.status != 503 || (e.Error.Code != "capacity_unknown" && e.Error.Code != "no_backend") || r.header.Get("Retry-After") == "" {
					t.Fatalf("want 503 capacity_unknown or no_backend with Retry-After, got %d %s", r.status, r.body)
				}
				return true
			})
			// It stays closed while the endpoint is broken: nothing is forwarded.
			after := eng.genCalls.Load()
			for i := 0; i < 5; i++ {
				if r := post(t, gw.URL, "/generate", tenantKey, small); r.status != 503 {
					t.Fatalf("request %d while capacity is unknown: %d %s", i, r.status, r.body)
				}
				time.Sleep(30 * time.Millisecond)
			}
			if eng.genCalls.Load() != after {
				t.Fatal("a request was forwarded while capacity was unknown")
			}
			t.Logf("%d request(s) served from the last good reading before it aged out", after-before)
		})
	}
	t.Run("smaller pool", func(t *testing.T) {
		eng.set(func(s *switchable) { s.info = infoJSON(2048) })
		eventually(t, 3*time.Second, "413 once the smaller pool is read", func() bool {
			return post(t, gw.URL, "/generate", tenantKey, mid).status == 413
		})
		if r := post(t, gw.URL, "/generate", tenantKey, small); r.status != 200 {
			t.Fatalf("a small request on the smaller pool: %d %s", r.status, r.body)
		}
		healthyNow()
	})
}

// A slow backend: one that sends no header within upstream.response_header_timeout, and one
// that stalls mid-stream past upstream.idle_timeout. The client is told (502, or an error
// event), promptly, with no backend detail.
func TestFaultSlowBackend(t *testing.T) {
	eng := newSwitchable(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("upstream: {response_header_timeout: 500ms, idle_timeout: 500ms}\n",
		[3]string{"eng", eng.url, "unified"})))
	release := make(chan struct{})
	defer close(release)
	t.Run("no first byte", func(t *testing.T) {
		eng.set(func(s *switchable) {
			s.gen = func(ctx *fasthttp.RequestCtx) {
				select {
				case <-release:
				case <-time.After(10 * time.Second):
				}
				okGenerate(ctx)
			}
		})
		for _, stream := range []bool{false, true} {
			start := time.Now()
			r := post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"text":"hi","stream":%v}`, stream))
			took := time.Since(start)
			if r.status != 504 || took > 3*time.Second {
				t.Fatalf("stream=%v: want a 504 within the header timeout, got %d after %s: %s", stream, r.status, took, r.body)
			}
			if e := decodeError(t, r); e.Error.Code != "upstream_timeout" || strings.Contains(string(r.body), eng.addr) || strings.Contains(string(r.body), "fasthttp") {
				t.Fatalf("the 502 carries internal detail: %s", r.body)
			}
		}
	})
	t.Run("stalls mid-stream", func(t *testing.T) {
		eng.set(func(s *switchable) {
			s.gen = func(ctx *fasthttp.RequestCtx) {
				ctx.SetContentType("text/event-stream")
				ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
					fmt.Fprint(w, `data: {"text":"first","meta_info":{"id":"x","prompt_tokens":1,"completion_tokens":1}}`+"\n\n")
					_ = w.Flush()
					select {
					case <-release:
					case <-time.After(10 * time.Second):
					}
				})
			}
		})
		status, body, took := streamAll(t, gw.URL, "/generate", `{"text":"hi","stream":true}`, 5*time.Second)
		if status != 200 || !bytes.Contains(body, []byte(`"upstream_error"`)) || took > 3*time.Second {
			t.Fatalf("a stalled stream: %d after %s: %q", status, took, body)
		}
		if !bytes.Contains(body, []byte(`"first"`)) {
			t.Fatalf("the event before the stall was lost: %q", body)
		}
	})
}

// Connection refused: an engine whose port is closed after it was read. The request gets a 502
// in OpenAI's envelope that names no address and no dial error (those go to the log), and once
// the poller notices, 503 with Retry-After.
func TestFaultConnectionRefused(t *testing.T) {
	eng := newSwitchable(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, withCapacity(gatewayYAML("", [3]string{"eng", eng.url, "unified"}), "{poll_interval: 1s, max_age: 3s}")))
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi"}`); r.status != 200 {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	_ = eng.srv.Shutdown()
	_ = eng.ln.Close()
	r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi"}`)
	if r.status != 502 && r.status != 503 {
		t.Fatalf("want 502 or 503, got %d %s", r.status, r.body)
	}
	e := decodeError(t, r)
	_, port, _ := net.SplitHostPort(eng.addr)
	for _, bad := range []string{eng.addr, port, "dial", "refused", "tcp"} {
		if strings.Contains(e.Error.Message, bad) {
			t.Fatalf("the error tells the client %q: %s", bad, r.body)
		}
	}
	eventually(t, 6*time.Second, "503 once the poller has seen the engine gone", func() bool {
		r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi"}`)
		return r.status == 503 && r.header.Get("Retry-After") != ""
	})
	// A backend that was never reachable (a closed port from the start).
	dead := procs.FreePort(t)
	gw2 := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"dead", fmt.Sprintf("http://127.0.0.1:%d", dead), "unified"})))
	r = post(t, gw2.URL, "/generate", tenantKey, `{"text":"hi"}`)
	if r.status != 503 || strings.Contains(string(r.body), fmt.Sprint(dead)) {
		t.Fatalf("never-reachable backend: %d %s", r.status, r.body)
	}
	var ready map[string]any
	if rr := get(t, gw2.URL+"/readyz", ""); json.Unmarshal(rr.body, &ready) != nil {
		t.Fatalf("readyz: %s", rr.body)
	}
}

// An engine reply too large to scan whole (over 64 MiB, non-streaming) or not JSON at all is
// refused with a 502 of the gateway's own, never passed on unscanned; the gateway stays healthy.
func TestFaultHugeOrForeignReply(t *testing.T) {
	eng := newSwitchable(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"eng", eng.url, "unified"})))
	for _, c := range []struct {
		name string
		gen  func(ctx *fasthttp.RequestCtx)
	}{
		{"80 MiB JSON", func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				_, _ = w.WriteString(`{"text":"`)
				chunk := strings.Repeat("x", 1<<20)
				for i := 0; i < 80; i++ {
					if _, err := w.WriteString(chunk); err != nil {
						return
					}
				}
				_, _ = w.WriteString(`"}`)
			})
		}},
		{"html", func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("text/html")
			ctx.SetBodyString("<html><body>hello</body></html>")
		}},
		{"octet stream", func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/octet-stream")
			ctx.SetBody([]byte{0, 1, 2, 3, 0xff})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng.set(func(s *switchable) { s.gen = c.gen })
			r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi"}`)
			if r.status != 502 || len(r.body) > 4096 {
				t.Fatalf("want a short 502, got %d (%d bytes) %.200s", r.status, len(r.body), r.body)
			}
			if e := decodeError(t, r); e.Error.Code != "upstream_error" {
				t.Fatalf("code %s", e.Error.Code)
			}
		})
	}
	eng.set(func(s *switchable) { s.gen = okGenerate })
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi"}`); r.status != 200 {
		t.Fatalf("after: %d %s", r.status, r.body)
	}
}
