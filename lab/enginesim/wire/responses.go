package wire

import (
	"encoding/json"
	"strings"
)

// ---- /v1/responses ----

// ResponsesReq is a /v1/responses body.
type ResponsesReq struct {
	EngineFields
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	User               string          `json:"user"`
}

// ResponsesInput decodes input: a string (one user message) or a list of
// message items whose content is a string or input_text/output_text parts.
func ResponsesInput(raw json.RawMessage) (roles, contents []string, err error) {
	if IsNull(raw) {
		return nil, nil, Badf("input is required")
	}
	if !IsArray(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, nil, Badf("input: want a string or a list of items")
		}
		return []string{"user"}, []string{s}, nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, nil, Badf("input: want a string or a list of items")
	}
	for i, it := range items {
		if it.Type != "" && it.Type != "message" {
			return nil, nil, Badf("input[%d]: only message items are supported, got %q", i, it.Type)
		}
		if it.Role == "" {
			return nil, nil, Badf("input[%d].role is required", i)
		}
		text, err := partsText(it.Content, "input[].content", "input_text", "output_text")
		if err != nil {
			return nil, nil, err
		}
		roles, contents = append(roles, it.Role), append(contents, text)
	}
	if len(roles) == 0 {
		return nil, nil, Badf("input: at least one item is required")
	}
	return roles, contents, nil
}

// partsText reads content that is a string or a list of {"type","text"}
// parts whose type is one of types.
func partsText(raw json.RawMessage, field string, types ...string) (string, error) {
	if IsNull(raw) {
		return "", nil
	}
	if !IsArray(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", Badf("%s: want a string or a list of parts", field)
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", Badf("%s: want a string or a list of parts", field)
	}
	var b strings.Builder
	for _, p := range parts {
		known := false
		for _, t := range types {
			known = known || p.Type == t
		}
		if !known || p.Text == nil {
			return "", Badf("%s: only %s parts are supported, got %q", field, strings.Join(types, "/"), p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// RespContent is an output_text part.
type RespContent struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// RespOutput is a message output item.
type RespOutput struct {
	Type    string        `json:"type"`
	ID      string        `json:"id"`
	Status  string        `json:"status"`
	Role    string        `json:"role"`
	Content []RespContent `json:"content"`
}

// RespUsage is a response's usage.
type RespUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

// Response is a response object.
type Response struct {
	ID                 string       `json:"id"`
	Object             string       `json:"object"`
	CreatedAt          int64        `json:"created_at"`
	Model              string       `json:"model"`
	Status             string       `json:"status"`
	Output             []RespOutput `json:"output"`
	Usage              *RespUsage   `json:"usage"`
	Instructions       *string      `json:"instructions"`
	MaxOutputTokens    *int         `json:"max_output_tokens"`
	PreviousResponseID *string      `json:"previous_response_id"`
	Error              any          `json:"error"`
	IncompleteDetails  any          `json:"incomplete_details"`
	ParallelToolCalls  bool         `json:"parallel_tool_calls"`
	ToolChoice         string       `json:"tool_choice"`
	Tools              []any        `json:"tools"`
}
