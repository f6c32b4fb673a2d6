package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"github.com/kvgate/kvgate/tokenize/imagesize"
	"github.com/kvgate/kvgate/tokenize/vision"
)

// renderChat renders a chat completions body as SGLang does with a model's own chat template:
// text content parts joined with a space (or, for a template that loops over content, the
// parts as a list with each image as {"type": "image"}), tool-call arguments given as a JSON
// string decoded into an object, tools as sent, chat_template_kwargs as template variables, and
// the generation prompt unless add_generation_prompt is false or continue_final_message is true.
// With an image rule (the model's preprocessor_config.json), each image's placeholder in the
// rendering is then replaced by what the processor makes of the image (its size read from the
// data URL's header), as transformers' processors expand it before tokenizing.
func renderChat(t *kvmodel.HFTokenizer, rule *vision.Rule) func(body []byte) (string, error) {
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
		var expansions []string
		for i, m := range req.Messages {
			out := make(map[string]any, len(m))
			for k, v := range m {
				out[k] = v
			}
			if c, ok := m["content"]; ok {
				if text, isParts := partsText(c); isParts {
					out["content"] = text
					if t.T.RendersParts() {
						parts, exp, err := imageParts(c, rule)
						if err != nil {
							return "", err
						}
						out["content"], expansions = parts, append(expansions, exp...)
					}
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
		if len(expansions) == 0 {
			return text, nil
		}
		// The processor replaces the placeholders in order, one image each.
		var b strings.Builder
		ph := rule.Placeholder()
		for _, exp := range expansions {
			before, after, ok := strings.Cut(text, ph)
			if !ok {
				return "", fmt.Errorf("the chat template rendered fewer image placeholders than the %d images", len(expansions))
			}
			b.WriteString(before)
			b.WriteString(exp)
			text = after
		}
		b.WriteString(text)
		return b.String(), nil
	}
}

// imageParts is a content's parts as the template receives them (text parts as sent, images as
// {"type": "image"}) and each image's expansion by rule; an image part without a rule, or
// whose data URL is not a readable base64 image, is an error (the engine cannot load it).
func imageParts(raw json.RawMessage, rule *vision.Rule) ([]any, []string, error) {
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, nil, err
	}
	out := make([]any, 0, len(parts))
	var exps []string
	for _, p := range parts {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		if typ != "image_url" {
			out = append(out, p)
			continue
		}
		if rule == nil {
			return nil, nil, fmt.Errorf("this model takes no images")
		}
		var iu struct {
			URL string `json:"url"`
		}
		_ = json.Unmarshal(p["image_url"], &iu)
		meta, data, ok := strings.Cut(iu.URL, ",")
		if !ok || !strings.HasPrefix(meta, "data:") || !strings.HasSuffix(meta, ";base64") {
			return nil, nil, fmt.Errorf("image_url: only base64 data URLs are loaded here")
		}
		size, err := imagesize.ReadBase64(data)
		if err != nil {
			return nil, nil, fmt.Errorf("image_url: %v", err)
		}
		exp, err := rule.Expansion(size.Width, size.Height)
		if err != nil {
			return nil, nil, fmt.Errorf("image_url: %v", err)
		}
		out = append(out, map[string]any{"type": "image"})
		exps = append(exps, exp)
	}
	return out, exps, nil
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
