package wire

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// ---- Anthropic /v1/messages ----

// AnthropicReq is a /v1/messages (or count_tokens) body.
type AnthropicReq struct {
	EngineFields
	Model     string          `json:"model"`
	System    json.RawMessage `json:"system"`
	Messages  []chatMessage   `json:"messages"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	Metadata  *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

// AnthropicPrompt renders system (a string or text blocks) as a system
// message, then the user/assistant messages, as chat does.
func AnthropicPrompt(req *AnthropicReq) (string, error) {
	if len(req.Messages) == 0 {
		return "", Badf("messages: at least one message is required")
	}
	var roles, contents []string
	if !IsNull(req.System) {
		sys, err := partsText(req.System, "system", "text")
		if err != nil {
			return "", err
		}
		roles, contents = append(roles, "system"), append(contents, sys)
	}
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return "", Badf("messages.%d.role: Input should be 'user' or 'assistant'", i)
		}
		t, err := partsText(m.Content, "messages.content", "text")
		if err != nil {
			return "", err
		}
		roles, contents = append(roles, m.Role), append(contents, t)
	}
	return RenderChatML(roles, contents), nil
}

// anthropicErrType maps a status to Anthropic's error type names.
func anthropicErrType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	}
	return "api_error"
}

// WriteAnthropicError answers status in Anthropic's error envelope.
func WriteAnthropicError(ctx *fasthttp.RequestCtx, status int, msg string) {
	b, _ := Marshal(map[string]any{"type": "error", "error": map[string]any{"type": anthropicErrType(status), "message": msg}})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// AnthropicUsage is a message's usage.
type AnthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// AnthropicMessage is a /v1/messages reply (and message_start's message).
type AnthropicMessage struct {
	ID           string             `json:"id"`
	Type         string             `json:"type"`
	Role         string             `json:"role"`
	Content      []AnthropicContent `json:"content"`
	Model        string             `json:"model"`
	StopReason   *string            `json:"stop_reason"`
	StopSequence *string            `json:"stop_sequence"`
	Usage        AnthropicUsage     `json:"usage"`
}

// AnthropicContent is a text content block.
type AnthropicContent struct {
	Type string `json:"type"`
	Text string `json:"text"`
}
