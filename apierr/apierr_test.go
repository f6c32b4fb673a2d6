package apierr

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
		{fmt.Errorf("%w: %w", ErrUpstreamTimeout, fasthttp.ErrDialTimeout), 504},
		{fmt.Errorf("wrapped: %w", os.ErrDeadlineExceeded), 504},
		{timeoutErr{}, 504},
		{ErrPrefillTimeout, 504},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused 10.0.0.7:30000")}, 502},
		{fasthttp.ErrConnectionClosed, 502},
		{context.Canceled, 502},
	} {
		e := FromUpstream(c.err)
		if e.Status != c.status {
			t.Errorf("%v: status %d, want %d", c.err, e.Status, c.status)
		}
		body := string(e.Body(OpenAI))
		if strings.Contains(body, "10.0.0.7") || strings.Contains(body, "tcp") || strings.Contains(body, "refused") {
			t.Errorf("%v: detail reached the client: %s", c.err, body)
		}
	}
}

// Every envelope and stream event is valid JSON of its route's shape, and the Responses API's
// whole-reply body is OpenAI's.
func TestEnvelopesAndEvents(t *testing.T) {
	e := &Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", Message: "slow down"}
	if got := string(e.Body(OpenAI)); got != `{"error":{"code":"rate_limit_exceeded","message":"slow down","param":null,"type":"requests"}}` {
		t.Fatalf("openai: %s", got)
	}
	if got := string(e.Body(Responses)); got != string(e.Body(OpenAI)) {
		t.Fatalf("responses body: %s", got)
	}
	if got := string(e.Body(Anthropic)); got != `{"error":{"message":"slow down","type":"rate_limit_error"},"type":"error"}` {
		t.Fatalf("anthropic: %s", got)
	}
	for env, want := range map[Envelope]string{
		OpenAI:    "data: " + string(e.Body(OpenAI)) + "\n\ndata: [DONE]\n\n",
		Anthropic: "event: error\ndata: " + string(e.Body(Anthropic)) + "\n\n",
		Responses: "event: error\ndata: {\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null,\"type\":\"error\"}\n\n",
	} {
		if got := string(e.Event(env)); got != want {
			t.Errorf("event %d: %q, want %q", env, got, want)
		}
	}
	if Internal.Status != 500 || Internal.AnthropicType() != "api_error" || ClientGone != 499 {
		t.Fatal("internal error and client-gone statuses")
	}
}

// What the access line records (the decision, a more precise code) never reaches the client.
func TestLogOnlyFieldsAreNeverSent(t *testing.T) {
	e := UpstreamFailed("The engine's reply could not be used.").LoggedAs("upstream_unreadable")
	e.Reason = "rate_limited_tpm"
	for env := range []Envelope{OpenAI, Anthropic, Responses} {
		for _, b := range [][]byte{e.Body(Envelope(env)), e.Event(Envelope(env))} {
			if s := string(b); strings.Contains(s, "upstream_unreadable") || strings.Contains(s, "rate_limited") {
				t.Fatalf("envelope %d carries a log-only field: %s", env, s)
			}
		}
	}
	if e.Logged() != "upstream_unreadable" || e.Code != "upstream_error" || UpstreamFailed("x").Logged() != "upstream_error" {
		t.Fatalf("logged %q, code %q", e.Logged(), e.Code)
	}
}
