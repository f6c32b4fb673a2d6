package gateway_test

import (
	"bytes"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/tests/testkit"
)

// The whole pipeline over loopback, in one process: a small chat request through the gateway to
// a fixed-reply engine (for profiles; make bench compares against nginx and a bare proxy).
func BenchmarkPipelineSmallChat(b *testing.B) {
	reply := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}}`)
	url := fakeUnified(&testing.T{}, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(reply)
	})
	gw := testkit.StartGateway(b, testkit.ParseConfig(b, hostileYAML(url, "")))
	body := []byte(`{"model":"sim","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":8}`)
	c := &fasthttp.HostClient{Addr: gw.Addr, MaxConns: 64}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		for pb.Next() {
			req.SetRequestURI("http://" + gw.Addr + "/v1/chat/completions")
			req.Header.SetMethod("POST")
			req.Header.Set("Authorization", "Bearer "+requesterKey)
			req.Header.SetContentType("application/json")
			req.SetBody(body)
			if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
			}
		}
	})
}

// A streamed chat reply of 64 content events through the gateway over loopback, canaries on, one
// reply at a time, the engine sending every event as its own chunk: all in one TCP write (burst)
// or one write per event, back to back (per-event). cpu-ns/op is the process's CPU time per
// reply (gateway, engine stand-in and client together: the last two do the same work on every
// side of a comparison); writes/op is the chunks the client got per reply, one write each.
func BenchmarkPipelineStream64(b *testing.B) {
	var burst strings.Builder
	burst.WriteString(sseHead)
	events := make([]string, 64)
	for k := range events {
		events[k] = chunk(chatEvent(k))
		burst.WriteString(events[k])
	}
	burst.WriteString(chatEndChunks())
	for _, c := range []struct {
		name string
		gen  func(net.Conn)
	}{
		{"burst", func(c net.Conn) { _, _ = io.WriteString(c, burst.String()) }},
		{"per-event", func(c net.Conn) {
			_, _ = io.WriteString(c, sseHead)
			for _, e := range events {
				_, _ = io.WriteString(c, e)
			}
			_, _ = io.WriteString(c, chatEndChunks())
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			gw := quietGateway(b, rawStreamEngine(b, c.gen))
			cl := dialStream(b, gw.Addr)
			writes := 0
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for b.Loop() {
				cl.ask(b, requesterKey)
				body, n, err := cl.readAll()
				if err != nil || !bytes.Contains(body, []byte("tok-063")) || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
					b.Fatalf("reply: %v\n%s", err, body)
				}
				writes += n
			}
			b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is this process's user and system CPU time so far, in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
