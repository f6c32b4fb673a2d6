package gateway

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/request"
)

// Anthropic's routes get Anthropic's envelope and error types; the others OpenAI's.
func TestErrorEnvelopes(t *testing.T) {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/v1/messages")
	writeError(&ctx, &apierr.Error{Status: 413, Type: "invalid_request_error", Code: "context_length_exceeded", Message: "too long"})
	if got := string(ctx.Response.Body()); got != `{"error":{"message":"too long","type":"request_too_large"},"type":"error"}` {
		t.Fatalf("anthropic: %s", got)
	}
	var o fasthttp.RequestCtx
	o.Request.SetRequestURI("/v1/chat/completions")
	writeError(&o, &apierr.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: 3})
	if got := string(o.Response.Body()); got != `{"error":{"code":"rate_limit_exceeded","message":"slow down","param":null,"type":"requests"}}` ||
		string(o.Response.Header.Peek("Retry-After")) != "3" {
		t.Fatalf("openai: %s", got)
	}
	for status, typ := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
		429: "rate_limit_error", 502: "api_error", 503: "overloaded_error"} {
		if got := (&apierr.Error{Status: status}).AnthropicType(); got != typ {
			t.Errorf("%d: %s, want %s", status, got, typ)
		}
	}
	if ev := string(errorEvent(request.Messages, apierr.UpstreamIntegrity())); !strings.HasPrefix(ev, "event: error\ndata: {\"error\":{") {
		t.Fatalf("anthropic stream error: %q", ev)
	}
	if ev := string(errorEvent(request.Chat, apierr.UpstreamIntegrity())); !strings.HasSuffix(ev, "data: [DONE]\n\n") {
		t.Fatalf("openai stream error: %q", ev)
	}
}
