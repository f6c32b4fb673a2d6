package gateway

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/request"
)

// Allocations per request and per event (issue 9). The backend is a fast-mode simulator in this
// process (inmemGateway), so a request's figures include the simulator's own work, loopback and
// fasthttp's client: BenchmarkRequest/direct is that floor, the rest is the gateway's.

const benchChat = `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one word."}],"max_tokens":8}`

// BenchmarkRequest is one small chat request through g.Handle (auth, parse, inject, count,
// decide, forward, scan, write), non-streaming and streaming (8 content events read to the end).
func BenchmarkRequest(b *testing.B) {
	g := inmemGateway(b, enginesim.Config{})
	bk := g.backends.Get("sim")
	b.Run("direct", func(b *testing.B) {
		// A client configured as the gateway's (streamed bodies).
		c := &fasthttp.HostClient{Addr: bk.Addr, StreamResponseBody: true}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		b.ReportAllocs()
		for b.Loop() {
			req.Reset()
			resp.Reset()
			req.Header.SetMethod("POST")
			req.SetRequestURI("http://" + bk.Addr + "/v1/chat/completions")
			req.SetBodyString(benchChat)
			if err := c.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			if _, err := resp.BodyUncompressed(); err != nil || resp.StatusCode() != 200 {
				b.Fatalf("status %d, %v", resp.StatusCode(), err)
			}
			_ = resp.CloseBodyStream()
		}
	})
	for _, c := range []struct{ name, body string }{
		{"chat", benchChat},
		{"chat-stream", benchChat[:len(benchChat)-1] + `,"stream":true}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			var ctx fasthttp.RequestCtx
			b.ReportAllocs()
			for b.Loop() {
				if code, body := serveOne(b, g, &ctx, "/v1/chat/completions", c.body); code != 200 {
					b.Fatalf("status %d: %s", code, body)
				}
			}
		})
	}
}

// BenchmarkRelayEvent is one streamed chat chunk through the relay (parse, decode, scan with the
// tenant's canaries on, re-serialise): allocs/op is allocations per event.
func BenchmarkRelayEvent(b *testing.B) {
	g := inmemGateway(b, enginesim.Config{})
	x := watched(&exchange{g: g, tenant: &g.tenants.Config()[0], rid: "bench", start: time.Now(), kind: request.Chat})
	ev := []byte("data: " + `{"id":"fast","object":"chat.completion.chunk","created":0,"model":"sim","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null,"matched_stop":null}]}` + "\n\n")
	s := streamOf(x)
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	for b.Loop() {
		// As relayReader does: the client's bytes are written (here: looked at), then consumed.
		s.e.Write(ev)
		if out := s.e.Pending(); len(out) == 0 || s.e.Ended() {
			b.Fatalf("event refused: %q", out)
		}
		s.e.Consume(len(s.e.Pending()))
	}
}
