package request

import (
	"bytes"
	"fmt"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/tokenize"
)

// The routes beyond chat, completions and /generate: OpenAI's Responses API, Anthropic's
// Messages API, and the prefill-only routes (embeddings, rerank, score, classify and SGLang's
// native /encode and /classify). Each is parsed into the same request value (prompts to count,
// output to reserve, where the marker goes) and goes through the same admission and relay.

const (
	Responses Kind = iota + Generate + 1
	Messages
	Embeddings
	Rerank
	Score
	Classify
	Encode
	ClassifyNative
	Kinds // number of kinds
)

var paths = [Kinds]string{
	Chat: "/v1/chat/completions", Completions: "/v1/completions", Generate: "/generate",
	Responses: "/v1/responses", Messages: "/v1/messages", Embeddings: "/v1/embeddings",
	Rerank: "/v1/rerank", Score: "/v1/score", Classify: "/v1/classify",
	Encode: "/encode", ClassifyNative: "/classify",
}

// ByPath maps each admitted route's path to its kind.
var ByPath = func() map[string]Kind {
	m := make(map[string]Kind, Kinds)
	for k := Kind(0); k < Kinds; k++ {
		m[paths[k]] = k
	}
	return m
}()

// Generates says whether the route produces text (reserves output, gets a canary marker and a
// cache salt); the others only prefill.
func (r Kind) Generates() bool { return r <= Messages }

// UnifiedOnly: prefill-only routes run on unified engines (a PD pair has nothing to decode).
func (r Kind) UnifiedOnly() bool { return !r.Generates() }

// ChatLike: the prompt is rendered from messages with the chat template.
func (r Kind) ChatLike() bool {
	return r == Chat || r == Responses || r == Messages
}

// parseMore parses the routes of this file.
func (r *Request) parseMore() *apierr.Error {
	if !r.Kind.Generates() {
		r.OutputGiven, r.N = true, 1 // nothing to generate: no output reservation
		defer func() {
			if r.Kind != Encode && r.Kind != ClassifyNative {
				r.Batch = false // OpenAI-shaped routes carry one rid for all their inputs
			}
		}()
	}
	switch r.Kind {
	case Responses:
		return r.parseResponses()
	case Messages:
		return r.parseMessages()
	case Embeddings, Classify:
		raw, ok := r.Fields["input"]
		if !ok || isNull(raw) {
			return apierr.BadRequest("input", "'input' is required.")
		}
		return r.idsOrTexts("input", raw)
	case Encode, ClassifyNative:
		text, hasText := r.Fields["text"]
		ids, hasIDs := r.Fields["input_ids"]
		switch {
		case hasText && !isNull(text) && hasIDs && !isNull(ids):
			return apierr.BadRequest("input_ids", "Give either 'text' or 'input_ids', not both.")
		case hasText && !isNull(text):
			return r.idsOrTexts("text", text)
		case hasIDs && !isNull(ids):
			return r.idsOrTexts("input_ids", ids)
		}
		return apierr.BadRequest("text", "'text' or 'input_ids' is required.")
	case Rerank, Score:
		return r.parsePairs()
	}
	return apierr.BadRequest("", "Unsupported route.")
}

// parsePairs: rerank and score run the query with every document (item) as one prompt each.
func (r *Request) parsePairs() *apierr.Error {
	docsField := "documents"
	if r.Kind == Score {
		docsField = "items"
	}
	var query string
	if err := json.Unmarshal(r.Fields["query"], &query); err != nil || query == "" {
		return apierr.BadRequest("query", "'query' must be a non-empty string.")
	}
	var docs []string
	if err := json.Unmarshal(r.Fields[docsField], &docs); err != nil || len(docs) == 0 {
		return apierr.BadRequest(docsField, fmt.Sprintf("'%s' must be a non-empty list of strings.", docsField))
	}
	// Counted as the engine's pair template would render them; the separators are in the text.
	for _, d := range docs {
		r.pairTexts = append(r.pairTexts, query+"\n\n"+d+"\n\n")
	}
	r.texts = r.pairTexts
	return nil
}

// parseResponses reads OpenAI's Responses API request: instructions and input items become chat
// messages for the count; the marker goes into the instructions.
func (r *Request) parseResponses() *apierr.Error {
	for _, k := range []string{"previous_response_id", "conversation"} {
		if raw, ok := r.Fields[k]; ok && !isNull(raw) {
			r.StoredContext = k // refused at admission unless policy.allow_stored_context
		}
	}
	if raw, ok := r.Fields["instructions"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &r.system) != nil {
			return apierr.BadRequest("instructions", "'instructions' must be a string.")
		}
		r.hasSystem = true
	}
	raw, ok := r.Fields["input"]
	if !ok || isNull(raw) {
		return apierr.BadRequest("input", "'input' is required.")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		r.turns = []tokenize.Message{{Role: "user", Content: s}}
	} else {
		var items []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
			return apierr.BadRequest("input", "'input' must be a string or a non-empty list of input items.")
		}
		for i, it := range items {
			field := fmt.Sprintf("input[%d]", i)
			if imgs, parts, e := responsesImages(field, it); e != nil {
				return e
			} else if parts != nil {
				r.addTurnParts(len(r.turns), parts)
				r.Images = append(r.Images, imgs...)
				it = textOnly(it, "input_image")
			}
			m, e := responsesItem(it)
			if e != "" {
				return apierr.BadRequest(field, e)
			}
			r.turns = append(r.turns, m)
		}
	}
	r.extra = extraJSON(r.Fields, "tools", "text", "reasoning")
	out, given, err := intField(r.Fields, "max_output_tokens")
	if err != nil {
		return err
	}
	r.Output, r.OutputGiven, r.N = out, given, 1
	return nil
}

// responsesItem renders one input item: a message (string or text parts), or a tool call, its
// output or a reasoning item, counted as its JSON (at least as long as what a template renders).
func responsesItem(it map[string]json.RawMessage) (tokenize.Message, string) {
	var typ, role string
	_ = json.Unmarshal(it["type"], &typ)
	_ = json.Unmarshal(it["role"], &role)
	switch typ {
	case "", "message":
		if role == "" {
			return tokenize.Message{}, "A message item needs a 'role'."
		}
		for k, v := range it {
			if k != "type" && k != "role" && k != "content" && k != "id" && k != "status" && !emptyJSON(v) {
				return tokenize.Message{}, fmt.Sprintf("Unsupported message item field %q.", k)
			}
		}
		text, err := partsText(it["content"], "input_text", "output_text", "text")
		if err != nil {
			return tokenize.Message{}, err.Error()
		}
		return tokenize.Message{Role: role, Content: text}, ""
	case "function_call", "function_call_output", "reasoning", "custom_tool_call", "custom_tool_call_output":
		raw, _ := json.Marshal(it)
		return tokenize.Message{Role: "tool", Content: string(raw)}, ""
	}
	return tokenize.Message{}, fmt.Sprintf("Input items of type %q are not supported: this gateway accepts text only.", typ)
}

// partsText is the text of a content that is a string, null, or a list of text parts of the
// given types (each part only with the keys type, text and empty annotations).
func partsText(raw json.RawMessage, textTypes ...string) (string, error) {
	if len(raw) == 0 || isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("'content' must be a string or a list of text parts")
	}
	var b strings.Builder
	for i, p := range parts {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		ok := false
		for _, t := range textTypes {
			ok = ok || typ == t
		}
		if !ok {
			return "", fmt.Errorf("content parts of type %q are not supported: this gateway accepts text only", typ)
		}
		for k, v := range p {
			if k != "type" && k != "text" && k != "cache_control" && k != "annotations" && k != "logprobs" && !emptyJSON(v) {
				return "", fmt.Errorf("unsupported content part field %q", k)
			}
		}
		var text string
		if err := json.Unmarshal(p["text"], &text); err != nil {
			return "", fmt.Errorf("a text part needs a string 'text'")
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(text)
	}
	return b.String(), nil
}

// parseMessages reads Anthropic's Messages API request.
func (r *Request) parseMessages() *apierr.Error {
	if raw, ok := r.Fields["system"]; ok && !isNull(raw) {
		text, err := partsText(raw, "text")
		if err != nil {
			return apierr.BadRequest("system", "'system' must be a string or a list of text blocks.")
		}
		r.system, r.hasSystem = text, true
	}
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(r.Fields["messages"], &msgs); err != nil || len(msgs) == 0 {
		return apierr.BadRequest("messages", "'messages' must be a non-empty array of message objects.")
	}
	for i, m := range msgs {
		var role string
		if json.Unmarshal(m["role"], &role) != nil || (role != "user" && role != "assistant") {
			return apierr.BadRequest(fmt.Sprintf("messages.%d.role", i), "Each message needs 'role' user or assistant.")
		}
		for k, v := range m {
			if k != "role" && k != "content" && !emptyJSON(v) {
				return apierr.BadRequest(fmt.Sprintf("messages.%d.%s", i, k), fmt.Sprintf("Unsupported message field %q.", k))
			}
		}
		content := m["content"]
		if imgs, parts, e := anthropicImages(fmt.Sprintf("messages.%d.content", i), content); e != nil {
			return e
		} else if parts != nil {
			r.addTurnParts(len(r.turns), parts)
			r.Images = append(r.Images, imgs...)
			content = textOnly(map[string]json.RawMessage{"content": content}, "image")["content"]
		}
		text, e := anthropicContent(content)
		if e != "" {
			return apierr.BadRequest(fmt.Sprintf("messages.%d.content", i), e)
		}
		r.turns = append(r.turns, tokenize.Message{Role: role, Content: text})
	}
	r.extra = extraJSON(r.Fields, "tools", "tool_choice", "thinking")
	out, given, err := intField(r.Fields, "max_tokens")
	if err != nil {
		return err
	}
	if !given {
		return apierr.BadRequest("max_tokens", "'max_tokens' is required.")
	}
	r.Output, r.OutputGiven, r.N = out, true, 1
	return nil
}

// anthropicContent is a message's text: a string, or blocks of text, tool use, tool results and
// thinking (the last three counted as their JSON). Images and documents are refused.
func anthropicContent(raw json.RawMessage) (string, string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, ""
	}
	var blocks []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", "'content' must be a string or a list of content blocks."
	}
	var b strings.Builder
	for _, bl := range blocks {
		var typ string
		_ = json.Unmarshal(bl["type"], &typ)
		switch typ {
		case "text":
			t, err := partsText(mustJSON([]map[string]json.RawMessage{bl}), "text")
			if err != nil {
				return "", err.Error()
			}
			b.WriteString(t)
		case "tool_use", "tool_result", "thinking", "redacted_thinking":
			raw, _ := json.Marshal(bl)
			b.Write(raw)
		default:
			return "", fmt.Sprintf("content blocks of type %q are not supported: this gateway accepts text only.", typ)
		}
		b.WriteByte('\n')
	}
	return b.String(), ""
}

// extraJSON joins the raw JSON of fields that templates render into the prompt.
func extraJSON(fields map[string]json.RawMessage, names ...string) string {
	var parts []string
	for _, k := range names {
		if raw, ok := fields[k]; ok && !isNull(raw) {
			parts = append(parts, string(raw))
		}
	}
	return strings.Join(parts, "\n")
}

// renderTurns is the prompt of a Responses or Messages request: the system text first.
func (r *Request) renderTurns() string {
	msgs := r.turns
	if r.hasSystem {
		msgs = append([]tokenize.Message{{Role: "system", Content: r.system}}, msgs...)
	}
	return tokenize.RenderChatML(msgs, r.extra)
}

// injectSystem puts the marker at the end of the system text, in the route's own field:
// Responses' instructions, or Anthropic's system (a text block of its own when it is blocks).
func (r *Request) injectSystem(marker string) {
	raw := bytes.TrimSpace(r.Fields["system"])
	if r.Kind == Messages && len(raw) > 0 && raw[0] == '[' {
		var blocks []json.RawMessage
		_ = json.Unmarshal(raw, &blocks) // validated at parse time
		blocks = append(blocks, mustJSON(map[string]string{"type": "text", "text": marker}))
		r.Fields["system"] = mustJSON(blocks)
		r.system += " " + marker // partsText joins blocks with a space
		return
	}
	r.system, r.hasSystem = canary.InjectSystemEnd(r.system, marker), true
	field := "instructions"
	if r.Kind == Messages {
		field = "system"
	}
	r.Fields[field] = mustJSON(r.system)
}

// storedContextError refuses a Responses request that the engine would extend from stored state.
func StoredContextError(field string) *apierr.Error {
	return apierr.BadRequest(field, fmt.Sprintf("'%s' makes the engine extend the prompt from stored state this gateway cannot count, so the size limit could not be enforced. Send the whole conversation in 'input' instead (or set policy.allow_stored_context).", field))
}

// promptParam names the field a 413 points at.
var promptParam = [Kinds]string{
	Chat: "messages", Completions: "prompt", Generate: "text", Responses: "input",
	Messages: "messages", Embeddings: "input", Rerank: "documents", Score: "items",
	Classify: "input", Encode: "text", ClassifyNative: "text",
}

// PromptParam names the field that holds the prompt (a 413 points at it).
func (r Kind) PromptParam() string { return promptParam[r] }
