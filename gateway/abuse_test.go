package gateway_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// HTTP abuse on raw loopback connections: request smuggling shapes, slow clients, oversized
// bodies and headers, connection limits. Every case also checks that nothing reached the engine.

const abuseServer = `max_body_bytes: 1048576
server: {header_timeout: 1s, read_timeout: 1s, max_header_bytes: 8192}
`

func abuseRig(t *testing.T, extra string) (*procs.Sim, *testkit.Gateway) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML(extra, [3]string{"sim", sim.URL, "unified"})))
	return sim, gw
}

func engineRequests(t *testing.T, sim *procs.Sim) int {
	n := 0
	for _, v := range sim.Stats(t).Requests {
		n += v
	}
	return n
}

func healthy(t *testing.T, gw *testkit.Gateway) {
	t.Helper()
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"fine","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("a normal request after the abuse: %d %s", r.status, r.body)
	}
}

// Smuggling: every request whose framing two parsers could read differently is refused (4xx,
// connection closed), and no request hidden in its body reaches the engine.
func TestAbuseSmuggling(t *testing.T) {
	sim, gw := abuseRig(t, abuseServer)
	auth := "Authorization: Bearer " + tenantKey + "\r\n"
	hidden := "POST /generate HTTP/1.1\r\nHost: gw\r\n" + auth + "Content-Length: 15\r\n\r\n{\"text\":\"evil\"}"
	inner := `{"text":"x","sampling_params":{"max_new_tokens":1}}`
	chunk := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(inner), inner)
	head := "POST /generate HTTP/1.1\r\nHost: gw\r\n" + auth + "Content-Type: application/json\r\n"
	cases := []struct{ name, raw string }{
		{"CL.TE", head + fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n", len(chunk)) + chunk + hidden},
		{"TE.CL", head + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunk + hidden},
		{"two content lengths", head + fmt.Sprintf("Content-Length: %d\r\nContent-Length: %d\r\n\r\n", len(inner), len(inner)+len(hidden)) + inner + hidden},
		{"content length list", head + fmt.Sprintf("Content-Length: %d, %d\r\n\r\n", len(inner), len(inner)) + inner},
		{"signed content length", head + fmt.Sprintf("Content-Length: +%d\r\n\r\n", len(inner)) + inner},
		{"negative content length", head + "Content-Length: -1\r\n\r\n" + inner + hidden},
		{"hex content length", head + fmt.Sprintf("Content-Length: 0x%x\r\n\r\n", len(inner)) + inner},
		{"space before colon", head + fmt.Sprintf("Content-Length : %d\r\n\r\n", len(inner)) + inner + hidden},
		{"TE gzip, chunked", head + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunk + hidden},
		{"TE xchunked", head + "Transfer-Encoding: xchunked\r\n\r\n" + chunk + hidden},
		{"TE identity", head + "Transfer-Encoding: identity\r\n\r\n" + inner + hidden},
		{"two transfer encodings", head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n" + chunk + hidden},
		{"obs-fold TE", head + "X-A: a\r\n Transfer-Encoding: chunked\r\n\r\n" + chunk + hidden},
		{"bare LF chunk", head + "Transfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\n%s\n0\n\n", len(inner), inner) + hidden},
		{"chunk size overflow", head + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff1\r\nx\r\n0\r\n\r\n" + hidden},
		{"header without colon", head + "Content-Length " + fmt.Sprint(len(inner)) + "\r\n\r\n" + inner + hidden},
		{"NUL in header name", head + "Content-\x00Length: 3\r\n\r\n" + inner + hidden},
		{"CR in header value", head + "X-A: a\rTransfer-Encoding: chunked\r\n\r\n" + chunk + hidden},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := engineRequests(t, sim)
			r := sendRaw(t, gw.Addr, []byte(c.raw), 5*time.Second)
			if r.resp == nil {
				// Closing without an answer is a refusal too; nothing must have reached the engine.
				t.Logf("closed without a response: %v", r.err)
			} else {
				if r.resp.StatusCode < 400 || r.resp.StatusCode > 499 {
					t.Fatalf("want a 4xx, got %d %s", r.resp.StatusCode, r.body)
				}
				if !r.closed {
					t.Fatalf("the connection stayed open after a %d: the rest of the bytes could be read as a request", r.resp.StatusCode)
				}
			}
			time.Sleep(20 * time.Millisecond)
			if n := engineRequests(t, sim) - before; n != 0 {
				t.Fatalf("%d request(s) reached the engine", n)
			}
		})
	}
	healthy(t, gw)
}

// A client that dribbles its headers, or its body, is cut off by server.header_timeout and
// server.read_timeout (1 s here), with a 408 when one can still be written.
func TestAbuseSlowClients(t *testing.T) {
	sim, gw := abuseRig(t, abuseServer)
	dribble := func(t *testing.T, first string, drip string, every time.Duration) (time.Duration, string) {
		c, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		if _, err := c.Write([]byte(first)); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(every):
				}
				if _, err := c.Write([]byte{drip[i%len(drip)]}); err != nil {
					return
				}
			}
		}()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		took := time.Since(start)
		if err != nil {
			return took, "closed: " + err.Error()
		}
		resp.Body.Close()
		return took, resp.Status
	}
	auth := "Authorization: Bearer " + tenantKey + "\r\n"
	t.Run("headers", func(t *testing.T) {
		took, got := dribble(t, "POST /generate HTTP/1.1\r\nHost: gw\r\n", "X-Slow: aaaaaaaaaaaaaaaa\r\n", 100*time.Millisecond)
		if took > 3*time.Second {
			t.Fatalf("a client dribbling headers held the connection %s (%s)", took, got)
		}
		t.Logf("cut after %s: %s", took.Round(time.Millisecond), got)
	})
	t.Run("request line", func(t *testing.T) {
		took, got := dribble(t, "P", "OST /generate HTTP/1.1", 100*time.Millisecond)
		if took > 3*time.Second {
			t.Fatalf("held %s (%s)", took, got)
		}
	})
	t.Run("body", func(t *testing.T) {
		before := engineRequests(t, sim)
		took, got := dribble(t, "POST /generate HTTP/1.1\r\nHost: gw\r\n"+auth+"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"text\":\"",
			"a", 50*time.Millisecond)
		if took > 3*time.Second {
			t.Fatalf("a client dribbling its body held the connection %s (%s)", took, got)
		}
		if !strings.HasPrefix(got, "408") {
			t.Fatalf("want 408, got %s", got)
		}
		if engineRequests(t, sim) != before {
			t.Fatal("a dribbled body reached the engine")
		}
		t.Logf("cut after %s: %s", took.Round(time.Millisecond), got)
	})
	t.Run("chunked body", func(t *testing.T) {
		took, got := dribble(t, "POST /generate HTTP/1.1\r\nHost: gw\r\n"+auth+"Transfer-Encoding: chunked\r\n\r\n", "1\r\na\r\n", 30*time.Millisecond)
		if took > 3*time.Second {
			t.Fatalf("held %s (%s)", took, got)
		}
		if !strings.HasPrefix(got, "408") {
			t.Fatalf("want 408, got %s", got)
		}
		t.Logf("cut after %s: %s", took.Round(time.Millisecond), got)
	})
	t.Run("idle keep-alive is not the body timeout", func(t *testing.T) {
		// A request that arrives in time is served even if it took most of the window.
		c, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		body := `{"text":"hi","sampling_params":{"max_new_tokens":1}}`
		fmt.Fprintf(c, "POST /generate HTTP/1.1\r\nHost: gw\r\n%sContent-Length: %d\r\n\r\n", auth, len(body))
		time.Sleep(600 * time.Millisecond)
		fmt.Fprint(c, body)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a slow-but-in-time body: %v %v", err, resp)
		}
		resp.Body.Close()
	})
	healthy(t, gw)
}

// A body over max_body_bytes is refused as soon as that is known, without waiting for the rest:
// a declared Content-Length at once, a chunked body once the limit is passed, an Expect:
// 100-continue before any body is sent.
func TestAbuseOversizedBody(t *testing.T) {
	sim, gw := abuseRig(t, abuseServer)
	auth := "Authorization: Bearer " + tenantKey + "\r\n"
	head := "POST /generate HTTP/1.1\r\nHost: gw\r\n" + auth + "Content-Type: application/json\r\n"
	// send writes first, then keeps the connection open without sending the rest, and reads the
	// answer: a gateway that waited for the whole body would never answer.
	send := func(t *testing.T, first string) (*http.Response, []byte) {
		c, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() { _, _ = c.Write([]byte(first)) }()
		_ = c.SetReadDeadline(time.Now().Add(900 * time.Millisecond)) // under read_timeout: not a timeout
		r := readRaw(c)
		if r.resp == nil {
			t.Fatalf("no answer while the rest of the body was still owed: %v", r.err)
		}
		return r.resp, r.body
	}
	before := engineRequests(t, sim)
	t.Run("declared length", func(t *testing.T) {
		resp, body := send(t, head+"Content-Length: 1073741824\r\n\r\n{\"text\":\""+strings.Repeat("a", 32<<10))
		if resp.StatusCode != 413 || !strings.Contains(string(body), "request_too_large") {
			t.Fatalf("want 413 request_too_large, got %d %s", resp.StatusCode, body)
		}
	})
	t.Run("chunked past the limit", func(t *testing.T) {
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 256<<10, strings.Repeat("a", 256<<10))
		resp, body := send(t, head+"Transfer-Encoding: chunked\r\n\r\n"+strings.Repeat(chunk, 5)) // 1.25 MiB, never terminated
		if resp.StatusCode != 413 {
			t.Fatalf("want 413, got %d %s", resp.StatusCode, body)
		}
	})
	t.Run("expect 100-continue", func(t *testing.T) {
		resp, body := send(t, head+"Content-Length: 1073741824\r\nExpect: 100-continue\r\n\r\n")
		if resp.StatusCode != 413 {
			t.Fatalf("want 413 before any body byte, got %d %s", resp.StatusCode, body)
		}
	})
	if engineRequests(t, sim) != before {
		t.Fatal("an oversized body reached the engine")
	}
	healthy(t, gw)
}

// Headers over server.max_header_bytes get 431 in OpenAI's envelope; so does a huge request line.
func TestAbuseHeaderLimits(t *testing.T) {
	sim, gw := abuseRig(t, abuseServer)
	before := engineRequests(t, sim)
	for _, c := range []struct{ name, raw string }{
		{"one big header", "POST /generate HTTP/1.1\r\nHost: gw\r\nX-Big: " + strings.Repeat("b", 20000) + "\r\nContent-Length: 2\r\n\r\n{}"},
		{"many headers", "POST /generate HTTP/1.1\r\nHost: gw\r\n" + strings.Repeat("X-A: 0123456789\r\n", 2000) + "Content-Length: 2\r\n\r\n{}"},
		{"long request line", "POST /generate?" + strings.Repeat("q", 20000) + " HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := sendRaw(t, gw.Addr, []byte(c.raw), 5*time.Second)
			if r.resp == nil {
				t.Fatalf("no answer: %v", r.err)
			}
			if r.resp.StatusCode != 431 || !strings.Contains(string(r.body), "request_header_too_large") {
				t.Fatalf("want 431 request_header_too_large, got %d %s", r.resp.StatusCode, r.body)
			}
		})
	}
	// Just under the limit is fine.
	req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"x","sampling_params":{"max_new_tokens":1}}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	req.Header.Set("X-Pad", strings.Repeat("p", 6000))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("6 KB of headers under an 8 KB limit: %v %v", err, resp)
	}
	resp.Body.Close()
	if engineRequests(t, sim) != before+1 {
		t.Fatal("an oversized header reached the engine")
	}
}

// server.max_conns_per_ip and server.max_conns bound the connections one client, and all, hold.
func TestAbuseConnectionLimits(t *testing.T) {
	for _, c := range []struct {
		name, cfg string
		limit     int
		status    int
	}{
		{"per ip", "server: {max_conns_per_ip: 4}\n", 4, 429},
		{"total", "server: {max_conns: 6}\n", 6, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, gw := abuseRig(t, c.cfg)
			// Idle connections held open (the readiness probe's connection is closed by now).
			time.Sleep(100 * time.Millisecond)
			var held []net.Conn
			defer func() {
				for _, h := range held {
					h.Close()
				}
			}()
			for i := 0; i < c.limit; i++ {
				h, err := net.Dial("tcp", gw.Addr)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, h)
			}
			time.Sleep(100 * time.Millisecond)
			r := sendRaw(t, gw.Addr, rawReq{path: "/generate", body: []byte(`{"text":"x"}`)}.bytes(), 5*time.Second)
			if r.resp == nil || r.resp.StatusCode != c.status {
				t.Fatalf("connection %d past the limit: want %d, got %v %s", c.limit+1, c.status, r.resp, r.err)
			}
			for _, h := range held {
				h.Close()
			}
			held = nil
			time.Sleep(200 * time.Millisecond)
			healthy(t, gw)
		})
	}
}
