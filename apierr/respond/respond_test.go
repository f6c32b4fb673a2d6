package respond_test

import (
	"encoding/json"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/apierr/respond"
)

// The writer sets the status, the JSON content type, Retry-After only when the error has one, and
// the body in the envelope asked for, replacing any body written before.
func TestErrorWritesStatusEnvelopeAndRetryAfter(t *testing.T) {
	for _, c := range []struct {
		e     *apierr.Error
		env   apierr.Envelope
		retry string
		check func(body []byte) bool
	}{
		{apierr.NoBackend(), apierr.OpenAI, "5", func(b []byte) bool {
			var v struct {
				Error struct{ Type, Code, Message string }
			}
			return json.Unmarshal(b, &v) == nil && v.Error.Code == "no_backend" && v.Error.Type == "server_error" && v.Error.Message != ""
		}},
		{apierr.BadRequest("max_tokens", "too many"), apierr.Anthropic, "", func(b []byte) bool {
			var v struct {
				Type  string
				Error struct{ Type, Message string }
			}
			return json.Unmarshal(b, &v) == nil && v.Type == "error" && v.Error.Type == "invalid_request_error" && v.Error.Message == "too many"
		}},
		{&apierr.Error{Status: 429, Type: "tokens", Code: "rate_limit_exceeded", Message: "never"}, apierr.Responses, "", func(b []byte) bool {
			var v struct {
				Error struct{ Code string }
			}
			return json.Unmarshal(b, &v) == nil && v.Error.Code == "rate_limit_exceeded"
		}},
	} {
		var ctx fasthttp.RequestCtx
		ctx.SetBodyString("partial")
		respond.Error(&ctx, c.e, c.env)
		body := ctx.Response.Body()
		if ctx.Response.StatusCode() != c.e.Status || string(ctx.Response.Header.ContentType()) != "application/json" ||
			string(ctx.Response.Header.Peek("Retry-After")) != c.retry || !c.check(body) {
			t.Errorf("%s: status %d, content type %q, Retry-After %q, body %s", c.e.Code, ctx.Response.StatusCode(),
				ctx.Response.Header.ContentType(), ctx.Response.Header.Peek("Retry-After"), body)
		}
	}
}
