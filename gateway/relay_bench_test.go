package gateway

import (
	"github.com/valyala/fasthttp"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tenants"
)

var (
	benchReply = []byte(`{"id":"chatcmpl-5c2d","object":"chat.completion","created":1772580196,"model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital of France, and it is known for the Eiffel Tower."},"finish_reason":"stop"}],"usage":{"prompt_tokens":27,"completion_tokens":18,"total_tokens":45}}`)
)

func benchExchange(b *testing.B) *exchange {
	g := guardGateway(b)
	return watched(&exchange{g: g, tenant: &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}, kind: request.Chat, rid: "r", route: &backends.Route{}})
}

// A whole non-streaming reply through the normaliser and the scanner (per reply).
func BenchmarkNormaliseBody(b *testing.B) {
	x := benchExchange(b)
	b.SetBytes(int64(len(benchReply)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		c := x.g.replies.NewCharge()
		if _, _, _, err := reply.BodyUsage(x.watch.Guard(), nil, benchReply, c); err != nil { // as writeEngineReply
			b.Fatal(err)
		}
		c.Done()
	}
}

// Admission of one small chat request (auth, read, key check, parse, inject, render, count,
// decide) with canaries on: the per-request cost before the engine is called.
func BenchmarkAdmitSmallChat(b *testing.B) {
	g := benchGateway(b, "tiktoken-go", 4090, 8192)
	body := []byte(`{"model":"sim","messages":[{"role":"system","content":"You are brief."},{"role":"user","content":"What is the capital of France?"}],"max_tokens":16}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.Header.Set("Authorization", "Bearer k")
		ctx.Request.SetBody(body)
		x := &exchange{g: g, kind: request.Chat, start: time.Now()}
		if e := x.admit(&ctx); e != nil {
			b.Fatalf("%+v", e)
		}
	}
}
