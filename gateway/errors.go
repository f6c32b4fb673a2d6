package gateway

import (
	"encoding/json"
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

// writeError is the one place an error becomes a response.
func writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	ctx.SetBody(e.body())
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
	errMethod = &apiError{Status: 405, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "Method not allowed on this route."}
)

func capacityUnknown() *apiError {
	return &apiError{Status: 503, Type: "server_error", Code: "capacity_unknown", RetryAfter: 2,
		Message: "The gateway has no current capacity reading for any backend, so it cannot check that the request fits. Retry shortly."}
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
