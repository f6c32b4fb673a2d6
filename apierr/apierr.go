// Package apierr is every error kvgate itself answers with: the error type, its envelopes
// (OpenAI's, a superset of SGLang's native {"error":{"message"}}; Anthropic's; the Responses API's
// stream event), the constructors, and the one mapping from a failed upstream call to what the
// client sees. It writes nothing to a connection: the server does that.
package apierr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// Error is one error answer.
type Error struct {
	Status     int
	Type       string
	Code       string
	Param      string
	Message    string
	RetryAfter int // seconds; 0 omits the header
	// Reason is the admission decision the access line records for a refusal (such as
	// "rate_limited_tpm" or "queue_full"); "" leaves the decision as it stood. Never sent.
	Reason string `json:"-"`
	// LogCode is what the access line records in place of Code ("": Code), where the log says
	// more than the client is told (such as "upstream_unreadable" behind a 502 upstream_error).
	// Never sent.
	LogCode string `json:"-"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Logged is the code the access line records: LogCode, else Code.
func (e *Error) Logged() string {
	if e.LogCode != "" {
		return e.LogCode
	}
	return e.Code
}

// LoggedAs is a copy of e that the access line records as code (the client still reads e's).
func (e *Error) LoggedAs(code string) *Error {
	c := *e
	c.LogCode = code
	return &c
}

// Envelope is the error shape a route's clients read.
type Envelope int

const (
	// OpenAI: {"error":{"message","type","param","code"}}; streams end with it then [DONE].
	OpenAI Envelope = iota
	// Anthropic: {"type":"error","error":{"type","message"}}, an "error" event in streams.
	Anthropic
	// Responses: OpenAI's body; in streams an "error" event {"type":"error","code","message"}.
	Responses
)

// Body is e in env's whole-reply envelope.
func (e *Error) Body(env Envelope) []byte {
	if env == Anthropic {
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": e.AnthropicType(), "message": e.Message}})
		return b
	}
	var param any
	if e.Param != "" {
		param = e.Param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": param, "code": e.Code,
	}})
	return b
}

// Event ends a stream with e, in the shape env's clients read.
func (e *Error) Event(env Envelope) []byte {
	var b bytes.Buffer
	switch env {
	case Anthropic:
		b.WriteString("event: error\ndata: ")
		b.Write(e.Body(Anthropic))
		b.WriteString("\n\n")
	case Responses:
		data, _ := json.Marshal(map[string]any{"type": "error", "code": e.Code, "message": e.Message, "param": nil})
		b.WriteString("event: error\ndata: ")
		b.Write(data)
		b.WriteString("\n\n")
	default:
		b.WriteString("data: ")
		b.Write(e.Body(OpenAI))
		b.WriteString("\n\ndata: [DONE]\n\n")
	}
	return b.Bytes()
}

// AnthropicType maps the status to Anthropic's error types.
func (e *Error) AnthropicType() string {
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

// BadRequest is a 400 naming the field at fault (param may be empty).
func BadRequest(param, msg string) *Error {
	return &Error{Status: 400, Type: "invalid_request_error", Code: "invalid_request", Param: param, Message: msg}
}

// TooLarge is a body over the gateway's limit.
func TooLarge(maxBytes int) *Error {
	return &Error{Status: 413, Type: "invalid_request_error", Code: "request_too_large",
		Message: "Request body is larger than the gateway accepts (" + strconv.Itoa(maxBytes) + " bytes)."}
}

// Fixed answers.
var (
	Unauthorized = &Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'."}
	NotFound = &Error{Status: 404, Type: "invalid_request_error", Code: "not_found",
		Message: "Unknown route."}
	RequestTimeout = &Error{Status: 408, Type: "invalid_request_error", Code: "request_timeout",
		Message: "The request was not received in time."}
	Method = &Error{Status: 405, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: "Method not allowed on this route."}
	Internal = &Error{Status: 500, Type: "server_error", Code: "internal_error",
		Message: "The gateway failed while handling this request. It was logged; retry the request."}
)

// ClientGone is the status logged for a client that left before its reply was complete
// (nginx's 499); the client itself is sent nothing more.
const ClientGone = 499

// CapacityUnknown: no current capacity reading, so no check is possible.
func CapacityUnknown() *Error {
	return &Error{Status: 503, Type: "server_error", Code: "capacity_unknown", RetryAfter: 2,
		Message: "The gateway has no current capacity reading for any backend, so it cannot check that the request fits. Retry shortly."}
}

// CountUnavailable: the prompt is over what the byte bound and the estimate can admit for the
// engines' tokenizer, and no engine gave a usable exact count (its /tokenize failed, was
// saturated or answered implausibly, or it was never calibrated).
func CountUnavailable() *Error {
	return &Error{Status: 503, Type: "server_error", Code: "count_unavailable", RetryAfter: 2,
		Message: "The gateway could not count this prompt's tokens with the engine's tokenizer, so it cannot check that the prompt fits. Retry shortly."}
}

// CountFailClosed: the model's admission is fail-closed after count drift (engines counted more
// prompt tokens than the gateway's bound) and this prompt had no exact count.
func CountFailClosed(model string, retryAfter int) *Error {
	return &Error{Status: 503, Type: "server_error", Code: "count_unavailable", RetryAfter: retryAfter,
		Message: fmt.Sprintf("Admission for model %q is fail-closed: engines counted more prompt tokens than this gateway did, so only prompts given as token ids (an exact count) are admitted now. An operator clears this once the count is fixed. Retry later.", model)}
}

// StateUnavailable: the shared store (Redis) did not answer an admin request; msg says what was
// or was not changed.
func StateUnavailable(msg string) *Error {
	return &Error{Status: 503, Type: "server_error", Code: "state_unavailable", RetryAfter: 5, Message: msg}
}

// NoBackend: every backend is down, quarantined or in the wrong role.
// ModelNotFound is OpenAI's answer to a model it does not serve (the id is the client's own).
func ModelNotFound(model string) *Error {
	return &Error{Status: 404, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)}
}

func NoBackend() *Error {
	return &Error{Status: 503, Type: "server_error", Code: "no_backend", RetryAfter: 5,
		Message: "No backend is available (all are down, quarantined or report the wrong role)."}
}

// ReplyOverBudget: the engine's whole reply does not fit in upstream.max_buffered_bytes beside
// the others being held; it is dropped, not the others.
func ReplyOverBudget() *Error {
	return &Error{Status: 503, Type: "server_error", Code: "reply_over_budget", RetryAfter: 2,
		Message: "The gateway is holding as many large replies as its memory allows, so this one was dropped. Retry shortly."}
}

// UpstreamFailed is a 502 with a generic message (details go to the log only).
func UpstreamFailed(msg string) *Error {
	return &Error{Status: 502, Type: "server_error", Code: "upstream_error", Message: msg}
}

// ShuttingDown: the gateway's drain (server.drain_timeout) ended with this request still open,
// so it was cut; another replica can serve it.
func ShuttingDown() *Error {
	return &Error{Status: 503, Type: "server_error", Code: "shutting_down", RetryAfter: 1,
		Message: "The gateway is shutting down and could not finish this reply within its drain timeout. Retry the request."}
}

// UpstreamIntegrity: the reply held another tenant's data and was cut.
func UpstreamIntegrity() *Error {
	return &Error{Status: 502, Type: "server_error", Code: "upstream_integrity",
		Message: "The engine's reply contained another tenant's data and was cut. The incident was recorded and the engines on this path are quarantined until an operator releases them; new requests go to other engines (503 no_backend while none is left)."}
}

// ErrPrefillTimeout: decode answered but prefill did not within upstream.response_header_timeout.
var ErrPrefillTimeout = errors.New("the prefill engine did not answer within upstream.response_header_timeout")

// ErrUpstreamTimeout marks an upstream call that ran out of time where the client library's own
// error does not say so (fasthttp's dial timeout): wrap it with this.
var ErrUpstreamTimeout = errors.New("the engine did not answer in time")

// FromUpstream is the one mapping from a failed upstream call to what the client sees: 504 when
// the engine did not answer in time, 502 otherwise, always with a generic message (backend
// names, addresses and transport errors go only to the log).
func FromUpstream(err error) *Error {
	var te interface{ Timeout() bool }
	if errors.Is(err, ErrUpstreamTimeout) || errors.Is(err, ErrPrefillTimeout) ||
		errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &te) && te.Timeout()) {
		return &Error{Status: 504, Type: "server_error", Code: "upstream_timeout", Message: "The engine did not answer in time."}
	}
	return UpstreamFailed("The engine could not be reached.")
}
