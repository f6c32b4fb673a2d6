package gateway

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
)

// framingError refuses a request whose body framing another HTTP parser (a load balancer in
// front of kvgate) could read differently, the shapes of request smuggling (RFC 9112 §6.3, §11.2):
// Content-Length and Transfer-Encoding together, more than one of either, a Transfer-Encoding
// other than exactly "chunked", and obsolete line folding. fasthttp picks one reading and goes
// on; kvgate answers 400 and closes the connection, so no byte after the headers is ever read as
// another request. It looks at the raw header block fasthttp set aside while parsing.
func framingError(ctx *fasthttp.RequestCtx) *apierr.Error {
	raw := ctx.Request.Header.RawHeaders()
	cl, te := 0, 0
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			return badFraming("Obsolete header line folding is not accepted.")
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue // fasthttp refuses these itself
		}
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			cl++
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			te++
			if !bytes.EqualFold(bytes.TrimSpace(value), []byte("chunked")) {
				return badFraming("Transfer-Encoding must be exactly 'chunked'.")
			}
		}
	}
	switch {
	case cl > 0 && te > 0:
		return badFraming("A request may not carry both Content-Length and Transfer-Encoding.")
	case cl > 1 || te > 1:
		return badFraming("A request may carry at most one Content-Length or Transfer-Encoding header.")
	}
	return nil
}

func badFraming(msg string) *apierr.Error {
	return &apierr.Error{Status: 400, Type: "invalid_request_error", Code: "invalid_framing", Message: msg}
}
