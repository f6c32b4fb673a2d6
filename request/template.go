package request

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/kvgate/kvgate/apierr"
)

// ChatTemplate renders chat messages as the served model's own template does (tokenize/hf):
// messages and tools are JSON arrays, kwargs a JSON object (nil when absent).
type ChatTemplate interface {
	Render(messages, tools json.RawMessage, addGenerationPrompt bool, kwargs json.RawMessage) (string, error)
}

// partsTemplate is a ChatTemplate that takes a message's content as a list of parts (SGLang's
// "openai" content format): engines hand it text parts as sent and each image as
// {"type": "image"}, which it renders as the model's image placeholder.
type partsTemplate interface {
	RendersParts() bool
}

// RenderTemplate replaces the ChatML rendering of a chat, Responses or Messages request with
// tmpl's (call it after Render, which it leaves alone for other kinds): the prompt is then the
// text the engine tokenizes, so a count of it is the engine's. Messages reach the template as an
// engine hands them over: text parts joined into one string, tool-call arguments given as a
// JSON string decoded into an object. A template that refuses the conversation (raise_exception)
// is a 400 naming messages: the engine would refuse it too.
//
// Fields the template does not see are not counted: response_format and the legacy functions
// (without tools) do not reach the prompt through a Hugging Face chat template.
//
// First, for every kind: when tmpl knows its model's media placeholder tokens (tokenize/hf), a
// body whose text spells one, or whose token ids hold one, is a 400 naming the field
// (media.go).
func (r *Request) RenderTemplate(tmpl ChatTemplate) *apierr.Error {
	if mt, ok := tmpl.(mediaTemplate); ok {
		if e := r.checkMediaTokens(mt.MediaTokens()); e != nil {
			return e
		}
	}
	var msgs []map[string]any
	var tools, kwargs json.RawMessage
	addGen := true
	pt, ok := tmpl.(partsTemplate)
	parts := ok && pt.RendersParts()
	switch r.Kind {
	case Chat:
		for _, m := range r.messages {
			out := make(map[string]any, len(m))
			for k, v := range m {
				out[k] = json.RawMessage(v)
			}
			text, _ := messageText(m["content"]) // validated at parse
			if raw, ok := m["content"]; ok && !isNull(raw) {
				out["content"] = text
				if c := bytes.TrimSpace(raw); parts && len(c) > 0 && c[0] == '[' {
					out["content"] = templateParts(raw)
				}
			}
			if raw, ok := m["tool_calls"]; ok && !isNull(raw) {
				out["tool_calls"] = decodedArguments(raw)
			}
			msgs = append(msgs, out)
		}
		tools, kwargs = r.Fields["tools"], withReasoningEffort(r.Fields["chat_template_kwargs"], r.Fields["reasoning_effort"])
		if raw, ok := r.Fields["add_generation_prompt"]; ok && !isNull(raw) {
			if json.Unmarshal(raw, &addGen) != nil {
				return apierr.BadRequest("add_generation_prompt", "'add_generation_prompt' must be a boolean.")
			}
		}
		if raw, ok := r.Fields["continue_final_message"]; ok && !isNull(raw) {
			var cont bool
			if json.Unmarshal(raw, &cont) == nil && cont {
				addGen = false
			}
		}
	case Responses, Messages:
		if r.hasSystem {
			msgs = append(msgs, map[string]any{"role": "system", "content": r.system})
		}
		for i, t := range r.turns {
			var content any = t.Content
			if parts && i < len(r.turnParts) && r.turnParts[i] != nil {
				content = r.turnParts[i]
			}
			msgs = append(msgs, map[string]any{"role": t.Role, "content": content})
		}
		tools = r.Fields["tools"]
	default:
		return nil
	}
	messages, err := json.Marshal(msgs)
	if err != nil {
		return apierr.BadRequest("messages", "Messages could not be rendered: "+err.Error())
	}
	text, err := tmpl.Render(messages, tools, addGen, kwargs)
	if err != nil {
		return apierr.BadRequest("messages", "The model's chat template refused the conversation: "+err.Error())
	}
	r.Prompts = []Prompt{{Text: text, Templated: true}}
	return nil
}

// decodedArguments returns tool calls with each function.arguments that is a JSON string holding
// an object replaced by that object, as SGLang does before rendering (templates print the
// object with tojson); anything else is kept as sent.
func decodedArguments(raw json.RawMessage) any {
	var calls []map[string]json.RawMessage
	if json.Unmarshal(raw, &calls) != nil {
		return raw
	}
	out := make([]any, len(calls))
	for i, c := range calls {
		fn := map[string]json.RawMessage{}
		if json.Unmarshal(c["function"], &fn) == nil && fn != nil {
			var args string
			if json.Unmarshal(fn["arguments"], &args) == nil && strings.HasPrefix(strings.TrimSpace(args), "{") && json.Valid([]byte(args)) {
				fn["arguments"] = json.RawMessage(compactJSON(args))
				cc := make(map[string]json.RawMessage, len(c))
				for k, v := range c {
					cc[k] = v
				}
				cc["function"], _ = json.Marshal(fn)
				out[i] = cc
				continue
			}
		}
		out[i] = c
	}
	return out
}

func compactJSON(s string) []byte {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return []byte(s)
	}
	return b.Bytes()
}

// withReasoningEffort adds the top-level reasoning_effort to the template's arguments, as engines
// hand it to templates that read it (gpt-oss); a reasoning_effort in kwargs wins.
func withReasoningEffort(kwargs, effort json.RawMessage) json.RawMessage {
	if len(effort) == 0 || isNull(effort) {
		return kwargs
	}
	kw := map[string]json.RawMessage{}
	if len(kwargs) > 0 && !isNull(kwargs) && json.Unmarshal(kwargs, &kw) != nil {
		return kwargs
	}
	if _, ok := kw["reasoning_effort"]; ok {
		return kwargs
	}
	kw["reasoning_effort"] = effort
	out, err := json.Marshal(kw)
	if err != nil {
		return kwargs
	}
	return out
}
