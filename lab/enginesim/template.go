package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// renderChat renders a chat completions body as SGLang does with a model's own chat template:
// text content parts joined with a space, tool-call arguments given as a JSON string decoded
// into an object, tools as sent, chat_template_kwargs as template variables, and the generation
// prompt unless add_generation_prompt is false or continue_final_message is true.
func renderChat(t *kvmodel.HFTokenizer) func(body []byte) (string, error) {
	return func(body []byte) (string, error) {
		var req struct {
			Messages             []map[string]json.RawMessage `json:"messages"`
			Tools                json.RawMessage              `json:"tools"`
			Kwargs               json.RawMessage              `json:"chat_template_kwargs"`
			AddGenerationPrompt  *bool                        `json:"add_generation_prompt"`
			ContinueFinalMessage bool                         `json:"continue_final_message"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return "", fmt.Errorf("invalid JSON body: %v", err)
		}
		msgs := make([]map[string]any, len(req.Messages))
		for i, m := range req.Messages {
			out := make(map[string]any, len(m))
			for k, v := range m {
				out[k] = v
			}
			if c, ok := m["content"]; ok {
				if text, isParts := partsText(c); isParts {
					out["content"] = text
				}
			}
			if tc, ok := m["tool_calls"]; ok {
				out["tool_calls"] = argumentsAsObjects(tc)
			}
			msgs[i] = out
		}
		messages, err := json.Marshal(msgs)
		if err != nil {
			return "", err
		}
		addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		if req.ContinueFinalMessage {
			addGen = false
		}
		text, err := t.T.Render(messages, req.Tools, addGen, req.Kwargs)
		if err != nil {
			return "", fmt.Errorf("chat template: %v", err)
		}
		return text, nil
	}
}

// partsText joins the text of a content given as an array of parts; false for anything else.
func partsText(raw json.RawMessage) (string, bool) {
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", false
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, " "), true
}

// argumentsAsObjects keeps every value as sent (RawMessage: objects keep their key order)
// except string arguments holding an object, which become that object.
func argumentsAsObjects(raw json.RawMessage) any {
	var calls []map[string]json.RawMessage
	if json.Unmarshal(raw, &calls) != nil {
		return raw
	}
	for _, c := range calls {
		var fn map[string]json.RawMessage
		if json.Unmarshal(c["function"], &fn) != nil || fn == nil {
			continue
		}
		var args string
		if json.Unmarshal(fn["arguments"], &args) == nil && json.Valid([]byte(args)) && strings.HasPrefix(strings.TrimSpace(args), "{") {
			var b bytes.Buffer
			_ = json.Compact(&b, []byte(args))
			fn["arguments"] = b.Bytes()
			c["function"], _ = json.Marshal(fn)
		}
	}
	return calls
}
