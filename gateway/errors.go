package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/request"
)

// anthropicPath: errors on these routes use Anthropic's envelope.
func anthropicPath(path []byte) bool { return bytes.HasPrefix(path, []byte("/v1/messages")) }

// writeError is the one place an error becomes a response: OpenAI's envelope, or Anthropic's on
// Anthropic's routes.
func writeError(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	env := apierr.OpenAI
	if anthropicPath(ctx.Path()) {
		env = apierr.Anthropic
	}
	ctx.SetBody(e.Body(env))
}

// envelopeOf is the error shape of a route kind's clients.
func envelopeOf(k request.Kind) apierr.Envelope {
	switch k {
	case request.Messages:
		return apierr.Anthropic
	case request.Responses:
		return apierr.Responses
	}
	return apierr.OpenAI
}

// fromUpstream maps a failed engine call (apierr.FromUpstream); fasthttp's dial timeout says it
// timed out only in its text, so it is marked.
func fromUpstream(err error) *apierr.Error {
	if errors.Is(err, fasthttp.ErrDialTimeout) {
		err = fmt.Errorf("%w: %w", apierr.ErrUpstreamTimeout, err)
	}
	return apierr.FromUpstream(err)
}

// errorEvent ends a stream of kind with e, in the shape that route's clients read.
func errorEvent(kind request.Kind, e *apierr.Error) []byte { return e.Event(envelopeOf(kind)) }
