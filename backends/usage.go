package backends

import (
	"encoding/json"
	"strconv"
	"strings"
)

// The one reader of the token counts engines report, in every dialect they speak, whole and
// streamed. Limit settlement and the tokenizer safety ratio both read usage through it, so the
// two cannot drift apart again. Values are decoded JSON (objects as map[string]any, numbers as
// json.Number). An engine is untrusted: a count that is not a non-negative JSON integer within
// MaxTokenCount, or a usage object that contradicts itself, is unknown, never 0.
//
// Where the counts are (prompt / output):
//   - OpenAI chat and completions: usage.prompt_tokens / usage.completion_tokens (a whole reply,
//     or a stream's final chunk, or every chunk with continuous usage stats: cumulative).
//   - Responses API: usage.input_tokens / usage.output_tokens in a whole reply; in a stream,
//     response.usage in response.completed, response.incomplete or response.failed.
//   - Anthropic Messages: usage.input_tokens (+ cache_creation_input_tokens and
//     cache_read_input_tokens, which are prompt too) / usage.output_tokens in a whole reply;
//     streamed, message_start's message.usage has the input, message_delta's usage the output
//     so far (cumulative).
//   - SGLang native /generate: meta_info.prompt_tokens / meta_info.completion_tokens, per item
//     of a batch (a list, or "index" in a streamed event), cumulative in a stream.

// MaxTokenCount bounds one count an engine may report: far above any context served today, far
// below what overflows a sum over a batch.
const MaxTokenCount = 1 << 31

// UsageReading is what one reply object or event says one item (batch index) used so far. A
// count is known only when its Has flag is set.
type UsageReading struct {
	Index                int
	Prompt, Output       int64
	HasPrompt, HasOutput bool
}

// ReadUsage is every reading in a decoded reply or event: one per item of a /generate batch
// list, else at most one. Nothing readable: none.
func ReadUsage(v any) []UsageReading {
	if items, ok := v.([]any); ok { // a whole /generate batch: one object per item, in order
		var out []UsageReading
		for i, it := range items {
			if r, ok := readObject(it); ok {
				r.Index = i
				out = append(out, r)
			}
		}
		return out
	}
	if r, ok := readObject(v); ok {
		return []UsageReading{r}
	}
	return nil
}

// PromptCount is the prompt count a single-item reply reports (0: unknown), for learning the
// tokenizer safety ratio.
func PromptCount(reply any) int {
	rs := ReadUsage(reply)
	if len(rs) != 1 || !rs[0].HasPrompt {
		return 0
	}
	return int(rs[0].Prompt)
}

// readObject reads one reply object or event. The first usage section found decides: a
// well-formed section elsewhere does not rescue a malformed one.
func readObject(v any) (UsageReading, bool) {
	m, _ := v.(map[string]any)
	if m == nil {
		return UsageReading{}, false
	}
	var r UsageReading
	sec, found := section(m)
	if !found {
		return r, false
	}
	var ok bool
	if r.Prompt, r.HasPrompt, r.Output, r.HasOutput, ok = counts(sec); !ok {
		return UsageReading{}, false
	}
	if idx, ok := m["index"]; ok && m["meta_info"] != nil { // a batch item's event (native only)
		i, ok := Count(idx)
		if !ok || i > 1<<20 {
			return UsageReading{}, false
		}
		r.Index = int(i)
	}
	return r, r.HasPrompt || r.HasOutput
}

// section finds the usage object: top-level usage (OpenAI, Responses, Anthropic whole), nested
// in a Responses event's response or an Anthropic message_start's message, or SGLang's
// meta_info. A section that is present but null or not an object is treated as absent only
// when null (usage: null is what OpenAI streams send in every chunk but the last).
func section(m map[string]any) (any, bool) {
	if u, ok := m["usage"]; ok && u != nil {
		return u, true
	}
	for _, outer := range []string{"response", "message"} {
		if o, ok := m[outer].(map[string]any); ok {
			if u, ok := o["usage"]; ok && u != nil {
				return u, true
			}
		}
	}
	if mi, ok := m["meta_info"]; ok && mi != nil {
		return mi, true
	}
	return nil, false
}

// counts reads one usage object. Every count field present must be valid, and a total given
// must equal prompt + output; otherwise the whole object is unknown (ok false).
func counts(sec any) (prompt int64, hasPrompt bool, output int64, hasOutput bool, ok bool) {
	s, _ := sec.(map[string]any)
	if s == nil {
		return 0, false, 0, false, false
	}
	get := func(key string) (int64, bool, bool) { // value, present, valid
		v, present := s[key]
		if !present {
			return 0, false, true
		}
		n, valid := Count(v)
		return n, true, valid
	}
	// OpenAI and SGLang name them prompt/completion; Responses and Anthropic input/output. An
	// object with both spellings that disagree is not believed.
	for _, pair := range [][2]string{{"prompt_tokens", "input_tokens"}, {"completion_tokens", "output_tokens"}} {
		a, hasA, okA := get(pair[0])
		b, hasB, okB := get(pair[1])
		if !okA || !okB || hasA && hasB && a != b {
			return 0, false, 0, false, false
		}
		n, has := a, hasA
		if hasB {
			n, has = b, true
		}
		if pair[0] == "prompt_tokens" {
			prompt, hasPrompt = n, has
		} else {
			output, hasOutput = n, has
		}
	}
	// Anthropic counts cached prompt tokens apart from input_tokens; they were prompt all the same.
	for _, k := range []string{"cache_creation_input_tokens", "cache_read_input_tokens"} {
		n, has, valid := get(k)
		if !valid {
			return 0, false, 0, false, false
		}
		if has && hasPrompt {
			prompt += n
		}
	}
	if t, has, valid := get("total_tokens"); !valid || has && hasPrompt && hasOutput && t != prompt+output {
		return 0, false, 0, false, false
	}
	return prompt, hasPrompt, output, hasOutput, true
}

// Count validates one count an engine reported: a JSON integer in [0, MaxTokenCount]. Anything
// else (absent, negative, 1.5, 1e9, a string, null) is not a reading.
func Count(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i < 0 || i > MaxTokenCount {
		return 0, false
	}
	return i, true
}

// CarriesText says whether a streamed event carries generated text (or tool-call arguments):
// what a stream without usage is charged by, a token an event. Role announcements, finish
// chunks, usage chunks, "done" events that repeat the text, pings and block starts carry none.
func CarriesText(v any) bool {
	m, _ := v.(map[string]any)
	if m == nil {
		return false
	}
	if t, _ := m["type"].(string); t != "" {
		switch {
		case t == "content_block_delta": // Anthropic: text, thinking or partial_json deltas
			d, _ := m["delta"].(map[string]any)
			return nonEmpty(d["text"]) || nonEmpty(d["thinking"]) || nonEmpty(d["partial_json"])
		case strings.HasPrefix(t, "response.") && strings.HasSuffix(t, ".delta"): // Responses
			return nonEmpty(m["delta"])
		}
		return false // every other typed event (starts, stops, "done" events repeating the text)
	}
	if cs, ok := m["choices"].([]any); ok { // OpenAI chunks: a delta's content, or a completion's text
		for _, c := range cs {
			cm, _ := c.(map[string]any)
			if nonEmpty(cm["text"]) {
				return true
			}
			d, _ := cm["delta"].(map[string]any)
			if nonEmpty(d["content"]) || nonEmpty(d["reasoning_content"]) {
				return true
			}
			if tc, ok := d["tool_calls"].([]any); ok && len(tc) > 0 {
				return true
			}
		}
		return false
	}
	return nonEmpty(m["text"]) // SGLang native (cumulative text: each event adds a token)
}

func nonEmpty(v any) bool {
	s, ok := v.(string)
	return ok && s != ""
}

// UsageTally sums what a whole exchange's replies or events reported, item by item. Counts are
// cumulative in every dialect that streams them, so each item keeps the largest reading of each
// count. Not safe for concurrent use.
type UsageTally struct {
	items      map[int]*UsageReading
	TextEvents int64 // streamed events that carried generated text
}

// Add notes one decoded reply or event (streamed: also whether it carried text).
func (t *UsageTally) Add(v any, streamed bool) {
	if streamed && CarriesText(v) {
		t.TextEvents++
	}
	for _, r := range ReadUsage(v) {
		if t.items == nil {
			t.items = map[int]*UsageReading{}
		}
		have := t.items[r.Index]
		if have == nil {
			have = &UsageReading{Index: r.Index}
			t.items[r.Index] = have
		}
		if r.HasPrompt {
			have.Prompt, have.HasPrompt = max(have.Prompt, r.Prompt), true
		}
		if r.HasOutput {
			have.Output, have.HasOutput = max(have.Output, r.Output), true
		}
	}
}

// Totals are the prompt and output counts over every item seen; each is known only when every
// item seen reported it (an item that reported only its output leaves the prompt total unknown).
func (t *UsageTally) Totals() (prompt int64, promptKnown bool, output int64, outputKnown bool) {
	if len(t.items) == 0 {
		return 0, false, 0, false
	}
	promptKnown, outputKnown = true, true
	for _, r := range t.items {
		prompt += r.Prompt
		output += r.Output
		promptKnown = promptKnown && r.HasPrompt
		outputKnown = outputKnown && r.HasOutput
	}
	return prompt, promptKnown, output, outputKnown
}
