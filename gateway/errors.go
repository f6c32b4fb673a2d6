package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"

	"github.com/valyala/fasthttp"
)

// apiError is every error kvgate itself produces, in OpenAI's envelope (a superset of SGLang's
// native {"error":{"message"}}). Engine errors are passed through unchanged instead.
type apiError struct {
	Status     int
	Type       string
	Code       string
	Param      string
	Message    string
	RetryAfter int // seconds; 0 omits the header
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func (e *apiError) body() []byte {
	var param any
	if e.Param != "" {
		param = e.Param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": param, "code": e.Code,
	}})
	return b
}

// anthropicBody is e in Anthropic's envelope, which its SDKs read on /v1/messages:
// {"type":"error","error":{"type":…,"message":…}}.
func (e *apiError) anthropicBody() []byte {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": e.anthropicType(), "message": e.Message}})
	return b
}

// anthropicType maps a status to Anthropic's error types.
func (e *apiError) anthropicType() string {
	switch {
	case e.Status == 400 || e.Status == 405 || e.Status == 422:
		return "invalid_request_error"
	case e.Status == 401:
		return "authentication_error"
	case e.Status == 403:
		return "permission_error"
	case e.Status == 404:
		return "not_found_error"
	case e.Status == 413:
		return "request_too_large"
	case e.Status == 429:
		return "rate_limit_error"
	case e.Status == 503 || e.Status == 529:
		return "overloaded_error"
	case e.Status >= 400 && e.Status < 500:
		return "invalid_request_error"
	}
	return "api_error"
}

// anthropicPath: errors on these routes use Anthropic's envelope.
func anthropicPath(path []byte) bool { return bytes.HasPrefix(path, []byte("/v1/messages")) }

// writeError is the one place an error becomes a response: OpenAI's envelope, or Anthropic's on
// Anthropic's routes.
func writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if anthropicPath(ctx.Path()) {
		ctx.SetBody(e.anthropicBody())
		return
	}
	ctx.SetBody(e.body())
}

// errorEvent ends a stream of kind with e, in the shape that route's clients read: OpenAI's
// error object then [DONE]; an "error" event for the Responses and Messages APIs.
func errorEvent(kind routeKind, e *apiError) []byte {
	var b bytes.Buffer
	switch kind {
	case routeMessages:
		b.WriteString("event: error\ndata: ")
		b.Write(e.anthropicBody())
		b.WriteString("\n\n")
	case routeResponses:
		data, _ := json.Marshal(map[string]any{"type": "error", "code": e.Code, "message": e.Message, "param": nil})
		b.WriteString("event: error\ndata: ")
		b.Write(data)
		b.WriteString("\n\n")
	default:
		b.WriteString("data: ")
		b.Write(e.body())
		b.WriteString("\n\ndata: [DONE]\n\n")
	}
	return b.Bytes()
}

func badRequest(param, msg string) *apiError {
	return &apiError{Status: 400, Type: "invalid_request_error", Code: "invalid_request", Param: param, Message: msg}
}

func tooLarge(maxBytes int) *apiError {
	return &apiError{Status: 413, Type: "invalid_request_error", Code: "request_too_large",
		Message: "Request body is larger than the gateway accepts (" + strconv.Itoa(maxBytes) + " bytes)."}
}

var (
	errUnauthorized = &apiError{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'."}
	errNotFound = &apiError{Status: 404, Type: "invalid_request_error", Code: "not_found",
		Message: "Unknown route."}
	errRequestTimeout = &apiError{Status: 408, Type: "invalid_request_error", Code: "request_timeout",
		Message: "The request was not received in time."}
	errInternal = &apiError{Status: 500, Type: "server_error", Code: "internal_error",
		Message: "The gateway failed while handling this request. It was logged; retry the request."}
	errMethod = &apiError{Status: 405, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "Method not allowed on this route."}
)

func capacityUnknown() *apiError {
	return &apiError{Status: 503, Type: "server_error", Code: "capacity_unknown", RetryAfter: 2,
		Message: "The gateway has no current capacity reading for any backend, so it cannot check that the request fits. Retry shortly."}
}

// countUnavailable: the prompt is over what the byte bound and the estimate can admit for the
// engines' tokenizer, and no engine gave a usable exact count (its /tokenize failed, was
// saturated or answered implausibly, or it was never calibrated).
func countUnavailable() *apiError {
	return &apiError{Status: 503, Type: "server_error", Code: "count_unavailable", RetryAfter: 2,
		Message: "The gateway could not count this prompt's tokens with the engine's tokenizer, so it cannot check that the prompt fits. Retry shortly."}
}

func noBackend() *apiError {
	return &apiError{Status: 503, Type: "server_error", Code: "no_backend", RetryAfter: 5,
		Message: "No backend is available (all are down, quarantined or report the wrong role)."}
}

func upstreamFailed(msg string) *apiError {
	return &apiError{Status: 502, Type: "server_error", Code: "upstream_error", Message: msg}
}

func upstreamIntegrity() *apiError {
	return &apiError{Status: 502, Type: "server_error", Code: "upstream_integrity",
		Message: "The engine's reply contained another tenant's data and was cut. The incident was recorded; retry the request."}
}

// mapUpstreamError is the one mapping from a failed upstream call to what the client sees: 504
// when the engine did not answer in time, 502 otherwise, always with a generic message (backend
// names, addresses and transport errors go only to the log).
func mapUpstreamError(err error) *apiError {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, errPrefillTimeout) ||
		errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return &apiError{Status: 504, Type: "server_error", Code: "upstream_timeout", Message: "The engine did not answer in time."}
	}
	return upstreamFailed("The engine could not be reached.")
}

// errPrefillTimeout: decode answered but prefill did not within upstream.response_header_timeout.
var errPrefillTimeout = errors.New("the prefill engine did not answer within upstream.response_header_timeout")
