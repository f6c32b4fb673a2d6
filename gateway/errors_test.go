package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "read tcp 10.0.0.7:30000: i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// One mapping from upstream failures to what a client sees: 504 on timeouts, 502 otherwise,
// never the transport detail (addresses, error text).
func TestMapUpstreamError(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
	}{
		{fasthttp.ErrTimeout, 504},
		{fasthttp.ErrDialTimeout, 504},
		{fmt.Errorf("wrapped: %w", os.ErrDeadlineExceeded), 504},
		{timeoutErr{}, 504},
		{errPrefillTimeout, 504},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused 10.0.0.7:30000")}, 502},
		{fasthttp.ErrConnectionClosed, 502},
		{context.Canceled, 502},
	} {
		e := mapUpstreamError(c.err)
		if e.Status != c.status {
			t.Errorf("%v: status %d, want %d", c.err, e.Status, c.status)
		}
		body := string(e.body())
		if strings.Contains(body, "10.0.0.7") || strings.Contains(body, "tcp") || strings.Contains(body, "refused") {
			t.Errorf("%v: detail reached the client: %s", c.err, body)
		}
	}
}

// Anthropic's routes get Anthropic's envelope and error types; the others OpenAI's.
func TestErrorEnvelopes(t *testing.T) {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/v1/messages")
	writeError(&ctx, &apiError{Status: 413, Type: "invalid_request_error", Code: "context_length_exceeded", Message: "too long"})
	if got := string(ctx.Response.Body()); got != `{"error":{"message":"too long","type":"request_too_large"},"type":"error"}` {
		t.Fatalf("anthropic: %s", got)
	}
	var o fasthttp.RequestCtx
	o.Request.SetRequestURI("/v1/chat/completions")
	writeError(&o, &apiError{Status: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: 3})
	if got := string(o.Response.Body()); got != `{"error":{"code":"rate_limit_exceeded","message":"slow down","param":null,"type":"requests"}}` ||
		string(o.Response.Header.Peek("Retry-After")) != "3" {
		t.Fatalf("openai: %s", got)
	}
	for status, typ := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
		429: "rate_limit_error", 502: "api_error", 503: "overloaded_error"} {
		if got := (&apiError{Status: status}).anthropicType(); got != typ {
			t.Errorf("%d: %s, want %s", status, got, typ)
		}
	}
	if ev := string(errorEvent(routeMessages, upstreamIntegrity())); !strings.HasPrefix(ev, "event: error\ndata: {\"error\":{") {
		t.Fatalf("anthropic stream error: %q", ev)
	}
	if ev := string(errorEvent(routeChat, upstreamIntegrity())); !strings.HasSuffix(ev, "data: [DONE]\n\n") {
		t.Fatalf("openai stream error: %q", ev)
	}
}
