// Package respond is the one writer of an apierr.Error onto a fasthttp response: its status,
// Retry-After when it has one, and its body in the envelope the route's clients read. It lives
// beside apierr, not in it, because apierr is linked by the parser and the reply path, which
// must not link fasthttp (TestReplyPathLinksNoFasthttp).
package respond

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
)

// Error replaces whatever body ctx's response had with e in env's envelope (apierr.OpenAI for
// every route but Anthropic's Messages), with e's status, the JSON content type and, when
// e.RetryAfter > 0, a Retry-After header in seconds (0: none, as for a request that waiting
// cannot cure). Other headers already set stay.
func Error(ctx *fasthttp.RequestCtx, e *apierr.Error, env apierr.Envelope) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	ctx.SetBody(e.Body(env))
}
