package enginesim

import (
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkGenerateSmall measures the CPU of one small non-streamed
// /generate through the real handler (no network): parse, tokenize, check,
// allocate, generate 16 tokens, encode, release.
func BenchmarkGenerateSmall(b *testing.B) {
	s, err := New(Config{PoolTokens: 65536, ContextLength: 32768})
	if err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	body := []byte(`{"text":"The quick brown fox jumps over the lazy dog. What is the capital of France?","sampling_params":{"max_new_tokens":16}}`)
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/generate")
		ctx.Request.SetBody(body)
		h(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

func BenchmarkChatSmall(b *testing.B) {
	s, err := New(Config{PoolTokens: 65536, ContextLength: 32768})
	if err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You are helpful. KVG-abcdefghijklmnopqrst"},{"role":"user","content":"What is the capital of France?"}],"max_tokens":16}`)
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.SetBody(body)
		h(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
}

// BenchmarkGenerateSmallUncached is the same with a prompt never seen
// before on every call, so the tokenizer cache does not help.
func BenchmarkGenerateSmallUncached(b *testing.B) {
	s, err := New(Config{PoolTokens: 65536, ContextLength: 32768})
	if err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/generate")
		ctx.Request.SetBody(fmt.Appendf(nil, `{"text":"Request %d: the quick brown fox jumps over the lazy dog. What is the capital of France?","sampling_params":{"max_new_tokens":16}}`, i))
		h(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
}
