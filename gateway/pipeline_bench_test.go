package gateway_test

import (
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
