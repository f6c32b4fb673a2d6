package request

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvgate/kvgate/apierr"
)

// The field table (issue 30): every request field an engine reads, per route and at every depth,
// with its verdict. The count is kvgate's model of the prompt the engine renders; a field the
// table does not name could change that prompt unseen, so it is refused wherever it sits (the
// rule that refuses unknown top-level fields reaches every nested object the engine reads).

// Verdict is what a field does to the prompt the gateway counts.
type Verdict uint8

const (
	// Modeled: the field's effect on the rendered prompt is in the count.
	Modeled Verdict = iota + 1
	// Inert: the field cannot change the prompt (sampling, output length, streaming, metadata).
	Inert
	// Refused: 400 in the route's envelope naming the field; no engine is contacted.
	Refused
)

func (v Verdict) String() string {
	switch v {
	case Modeled:
		return "modeled"
	case Inert:
		return "inert"
	case Refused:
		return "refused"
	}
	return "none"
}

// FieldRow is one row of the table. Path is the field's path in the body: keys joined by '.',
// "[]" after a key whose value is an array of objects, "[type=x]" for the objects of that array
// (or the object itself) whose "type" is x ("[type=]": no type given). A row for a path whose
// value has rows below it names an object whose keys are checked; a row with nothing below is a
// value taken whole (a string, a number, or JSON the engine hands on as it is: a schema, a
// logit_bias map).
type FieldRow struct {
	Path    string
	Verdict Verdict
	// Reason says why a field is refused, as a predicate ("is engine-internal…").
	Reason string
	// Policy: the field passes the table, and a policy setting decides (previous_response_id and
	// conversation: policy.allow_stored_context).
	Policy string
}

// fieldNode is the table as a tree, built once.
type fieldNode struct {
	verdict Verdict
	reason  string
	kids    map[string]*fieldNode // keys of the object (nil: the value is taken whole)
	byType  map[string]*fieldNode // variants by the object's "type" (nil: none)
	// emptyOK: an unknown key whose value is empty (null, "", [], {}) passes: it carries nothing
	// to render (clients echo assistant messages back with "refusal":null, "annotations":[]).
	emptyOK bool
	// switches: chat_template_kwargs, whose other keys are the served model's template switches
	// (checkTemplateKwargs, then CheckTemplateSwitches once the model is known).
	switches bool
}

func (n *fieldNode) checked() bool { return n.kids != nil || n.byType != nil }

// Reasons for the refused rows.
const (
	reasonEngineControl = "is engine-internal and may not be set by clients"
	reasonMedia         = "is not supported: this gateway accepts text and token ids only"
	reasonMediaPart     = "is a media part: this gateway does not count it, so it is not accepted"
	reasonTemplate      = "replaces or feeds the chat template the gateway counts with, so the size limit could not be enforced"
	reasonNotModeled    = "changes the prompt in a way the gateway does not count"
	// The year's advisories (issue 39): each reason names what the engine does with the field.
	reasonRequestID      = "is the engine's request id: the engine sees the gateway's own (a client's could collide with another request's, CVE-2026-112266); send X-Request-Id to name a request"
	reasonCacheKeys      = "sets the engine's multimodal cache keys: a client could name another request's cached media (CVE-2026-111392)"
	reasonPromptLogprobs = "makes the engine compute log-probabilities over every prompt token, which crashes engines (CVE-2026-116180)"
	reasonEmbeds         = "feeds the model embeddings instead of tokens: the gateway can neither count nor mark them"
	reasonKwargs         = "passes arguments to the engine's processor, which change how many tokens the input expands to"
	reasonThinkingBudget = "makes vLLM force its reasoning-end string into another concurrent request's output (GHSA-fpch-3xrf-7q96); SGLang's sampling_params.thinking_budget and Anthropic's thinking.budget_tokens are accepted"
)

// sharedRefused are refused on every route, whatever it reads.
var sharedRefused = func() []FieldRow {
	var rows []FieldRow
	for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "custom_logit_processor",
		"return_hidden_states", "session_params"} {
		rows = append(rows, FieldRow{Path: k, Verdict: Refused, Reason: reasonEngineControl})
	}
	for _, k := range []string{"image_data", "audio_data", "video_data", "modalities", "audio"} {
		rows = append(rows, FieldRow{Path: k, Verdict: Refused, Reason: reasonMedia})
	}
	rows = append(rows, refused(reasonRequestID, "rid", "request_id")...)
	rows = append(rows, refused(reasonCacheKeys, "mm_hashes")...)
	rows = append(rows, refused(reasonPromptLogprobs, "prompt_logprobs")...)
	rows = append(rows, refused(reasonEmbeds, "prompt_embeds", "input_embeds")...)
	rows = append(rows, refused(reasonKwargs, "mm_processor_kwargs")...)
	rows = append(rows, refused(reasonThinkingBudget, "thinking_token_budget")...)
	for _, k := range []string{"chat_template", "documents", "tokenizer_kwargs"} {
		rows = append(rows, FieldRow{Path: k, Verdict: Refused, Reason: reasonTemplate})
	}
	for _, k := range []string{"add_special_tokens", "truncate_prompt_tokens", "return_tokens_as_token_ids", "priority", "kv_transfer_params", "vllm_xargs"} {
		rows = append(rows, FieldRow{Path: k, Verdict: Refused, Reason: reasonNotModeled})
	}
	return rows
}()

// rows builds rows of one verdict.
func rows(v Verdict, paths ...string) []FieldRow {
	out := make([]FieldRow, len(paths))
	for i, p := range paths {
		out[i] = FieldRow{Path: p, Verdict: v}
	}
	return out
}

func refused(reason string, paths ...string) []FieldRow {
	out := rows(Refused, paths...)
	for i := range out {
		out[i].Reason = reason
	}
	return out
}

func join(parts ...[]FieldRow) []FieldRow {
	var out []FieldRow
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// openAISampling are the OpenAI routes' sampling and output fields SGLang reads: none reaches the prompt.
var openAISampling = rows(Inert, "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream",
	"stream_options", "stream_options.include_usage", "stream_options.continuous_usage_stats", "stop", "stop_token_ids",
	"presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "user", "seed",
	"regex", "ebnf", "json_schema", "ignore_eos", "skip_special_tokens", "no_stop_trim", "min_tokens", "lora_path",
	"cache_salt")

// chatParts are the content parts of a chat message (OpenAI's chat completions).
var chatParts = func(prefix string) []FieldRow {
	return join(
		rows(Modeled, prefix+"[type=text]", prefix+"[type=text].type", prefix+"[type=text].text"),
		// Images are sized from their headers and charged by the model's processor rule
		// (request/images.go); a model without a rule refuses them there.
		rows(Modeled, prefix+"[type=image_url]", prefix+"[type=image_url].type", prefix+"[type=image_url].image_url",
			prefix+"[type=image_url].image_url.url", prefix+"[type=image_url].image_url.detail"),
		refused(reasonMediaPart, prefix+"[type=input_audio]", prefix+"[type=video_url]",
			prefix+"[type=audio_url]", prefix+"[type=file]", prefix+"[type=image]", prefix+"[type=input_image]", prefix+"[type=audio]"))
}

// FieldTable is the table, per route. Routes not named here (the utility routes) keep their own
// lists (gateway/utility.go).
var FieldTable = map[Kind][]FieldRow{
	Chat: join(openAISampling, rows(Inert, "max_completion_tokens", "top_logprobs", "tool_choice", "tool_choice.type",
		"tool_choice.function", "tool_choice.function.name", "function_call", "function_call.name", "parallel_tool_calls",
		"separate_reasoning", "stream_reasoning", "metadata", "store", "service_tier"),
		rows(Modeled, "messages", "messages[].role", "messages[].content", "messages[].name",
			"messages[].tool_calls", "messages[].tool_calls[].id", "messages[].tool_calls[].type", "messages[].tool_calls[].index",
			"messages[].tool_calls[].function", "messages[].tool_calls[].function.name", "messages[].tool_calls[].function.arguments",
			"messages[].tool_call_id", "messages[].function_call", "messages[].function_call.name", "messages[].function_call.arguments",
			"messages[].reasoning_content",
			"tools", "tools[].type", "tools[].function", "tools[].function.name", "tools[].function.description",
			"tools[].function.parameters", "tools[].function.strict",
			"functions", "functions[].name", "functions[].description", "functions[].parameters",
			"response_format", "response_format.type", "response_format.json_schema", "response_format.json_schema.name",
			"response_format.json_schema.description", "response_format.json_schema.schema", "response_format.json_schema.strict",
			"response_format.structures", "response_format.triggers", "response_format.schema",
			"reasoning_effort", "continue_final_message", "add_generation_prompt",
			"chat_template_kwargs", "chat_template_kwargs.enable_thinking", "chat_template_kwargs.thinking",
			"chat_template_kwargs.reasoning_effort"),
		chatParts("messages[].content"),
		refused(reasonTemplate, "chat_template_kwargs.chat_template", "chat_template_kwargs.tokenize",
			"chat_template_kwargs.add_generation_prompt", "chat_template_kwargs.continue_final_message",
			"chat_template_kwargs.documents", "chat_template_kwargs.messages", "chat_template_kwargs.tools",
			"chat_template_kwargs.bos_token", "chat_template_kwargs.eos_token"),
		sharedRefused),
	Completions: join(openAISampling, rows(Inert, "echo", "best_of"), rows(Modeled, "prompt", "suffix"), sharedRefused),
	Generate: join(rows(Inert, "stream", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
		"return_text_in_logprobs", "lora_path", "log_metrics", "sampling_params"),
		rows(Modeled, "text", "input_ids"),
		func() []FieldRow {
			var out []FieldRow
			for _, k := range sortedKeys(samplingKeys) {
				out = append(out, FieldRow{Path: "sampling_params." + k, Verdict: Inert})
			}
			return out
		}(),
		refused("feeds custom logit processors (engine-side code)", "sampling_params.custom_params"),
		refused(reasonPromptLogprobs, "sampling_params.prompt_logprobs"),
		sharedRefused),
	Responses: join(rows(Inert, "model", "max_output_tokens", "temperature", "top_p", "stream", "stream_options",
		"stream_options.include_usage", "stream_options.include_obfuscation", "tool_choice", "tool_choice.type", "tool_choice.name",
		"parallel_tool_calls", "metadata", "store", "user", "truncation", "include", "top_logprobs", "service_tier", "cache_salt"),
		rows(Modeled, "instructions", "input",
			"input[type=]", "input[type=].role", "input[type=].content", "input[type=].id", "input[type=].status",
			"input[type=message]", "input[type=message].type", "input[type=message].role", "input[type=message].content",
			"input[type=message].id", "input[type=message].status",
			"tools", "tools[].type", "tools[].name", "tools[].description", "tools[].parameters", "tools[].strict",
			"text", "text.format", "text.format.type", "text.format.name", "text.format.description", "text.format.schema",
			"text.format.strict", "text.verbosity",
			"reasoning", "reasoning.effort", "reasoning.summary", "reasoning.generate_summary"),
		responsesItems("input"), responsesParts("input[type=].content"), responsesParts("input[type=message].content"),
		[]FieldRow{{Path: "previous_response_id", Verdict: Refused, Reason: "extends the prompt from stored state the gateway cannot count",
			Policy: "policy.allow_stored_context"},
			{Path: "conversation", Verdict: Refused, Reason: "extends the prompt from stored state the gateway cannot count",
				Policy: "policy.allow_stored_context"}},
		sharedRefused),
	Messages: join(rows(Inert, "model", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
		"metadata", "metadata.user_id", "service_tier", "cache_salt"),
		rows(Modeled, "messages", "messages[].role", "messages[].content", "system",
			"system[type=text]", "system[type=text].type", "system[type=text].text", "system[type=text].cache_control",
			"tools", "tools[].name", "tools[].description", "tools[].input_schema", "tools[].type", "tools[].cache_control",
			"tool_choice", "tool_choice.type", "tool_choice.name", "tool_choice.disable_parallel_tool_use",
			"thinking", "thinking.type", "thinking.budget_tokens"),
		anthropicBlocks("messages[].content"),
		sharedRefused),
	Embeddings:     join(rows(Inert, "model", "encoding_format", "dimensions", "user"), rows(Modeled, "input"), sharedRefused),
	Rerank:         join(rows(Inert, "model", "top_n", "return_documents"), rows(Modeled, "query", "documents"), withoutRow(sharedRefused, "documents")),
	Score:          join(rows(Inert, "model", "label_token_ids", "apply_softmax", "item_first"), rows(Modeled, "query", "items"), sharedRefused),
	Classify:       join(rows(Inert, "model", "user"), rows(Modeled, "input"), sharedRefused),
	Encode:         join(rows(Modeled, "text", "input_ids"), sharedRefused),
	ClassifyNative: join(rows(Modeled, "text", "input_ids"), sharedRefused),
}

// withoutRow drops the row for path (rerank reads documents as its prompt).
func withoutRow(in []FieldRow, path string) []FieldRow {
	var out []FieldRow
	for _, r := range in {
		if r.Path != path {
			out = append(out, r)
		}
	}
	return out
}

// responsesItems are the Responses API's non-message input items: counted as their JSON.
func responsesItems(prefix string) []FieldRow {
	var out []FieldRow
	for typ, keys := range map[string][]string{
		"function_call":           {"type", "id", "call_id", "name", "arguments", "status"},
		"function_call_output":    {"type", "id", "call_id", "output", "status"},
		"reasoning":               {"type", "id", "summary", "content", "encrypted_content", "status"},
		"custom_tool_call":        {"type", "id", "call_id", "name", "input", "status"},
		"custom_tool_call_output": {"type", "id", "call_id", "output"},
	} {
		p := prefix + "[type=" + typ + "]"
		out = append(out, FieldRow{Path: p, Verdict: Modeled})
		for _, k := range keys {
			out = append(out, FieldRow{Path: p + "." + k, Verdict: Modeled})
		}
	}
	return out
}

// responsesParts are a Responses message's content parts.
func responsesParts(prefix string) []FieldRow {
	var out []FieldRow
	for _, typ := range []string{"input_text", "output_text", "text"} {
		p := prefix + "[type=" + typ + "]"
		out = append(out, rows(Modeled, p, p+".type", p+".text")...)
		out = append(out, rows(Inert, p+".annotations", p+".logprobs", p+".cache_control")...)
	}
	img := prefix + "[type=input_image]"
	out = append(out, rows(Modeled, img, img+".type", img+".image_url", img+".detail")...)
	return append(out, refused(reasonMediaPart, prefix+"[type=input_file]", prefix+"[type=input_audio]")...)
}

// anthropicBlocks are the content blocks of an Anthropic message.
func anthropicBlocks(prefix string) []FieldRow {
	var out []FieldRow
	for typ, keys := range map[string][]string{
		"text":              {"type", "text", "cache_control"},
		"tool_use":          {"type", "id", "name", "input", "cache_control"},
		"tool_result":       {"type", "tool_use_id", "content", "is_error", "cache_control"},
		"thinking":          {"type", "thinking", "signature"},
		"redacted_thinking": {"type", "data"},
	} {
		p := prefix + "[type=" + typ + "]"
		out = append(out, FieldRow{Path: p, Verdict: Modeled})
		for _, k := range keys {
			out = append(out, FieldRow{Path: p + "." + k, Verdict: Modeled})
		}
	}
	img := prefix + "[type=image]"
	out = append(out, rows(Modeled, img, img+".type", img+".source", img+".source.type", img+".source.media_type",
		img+".source.data", img+".source.url", img+".cache_control")...)
	return append(out, refused(reasonMediaPart, prefix+"[type=document]")...)
}

// fieldTrees are the table's trees per route, built at init; a bad row panics there (a test
// builds them too).
var fieldTrees = func() (t [Kinds]*fieldNode) {
	for k, rs := range FieldTable {
		root, err := buildTree(rs)
		if err != nil {
			panic(fmt.Sprintf("request field table, %s: %v", k.Path(), err))
		}
		t[k] = root
	}
	return t
}()

// buildTree turns rows into a tree. A row's parent must come first (rows are sorted by path
// length first, so any order of rows works).
func buildTree(rs []FieldRow) (*fieldNode, error) {
	sorted := append([]FieldRow(nil), rs...)
	sort.SliceStable(sorted, func(i, j int) bool { return strings.Count(sorted[i].Path, ".") < strings.Count(sorted[j].Path, ".") })
	root := &fieldNode{kids: map[string]*fieldNode{}}
	for _, r := range sorted {
		if r.Verdict == 0 {
			return nil, fmt.Errorf("%s: no verdict", r.Path)
		}
		if r.Verdict == Refused && r.Reason == "" {
			return nil, fmt.Errorf("%s: refused without a reason", r.Path)
		}
		n := root
		segs := strings.Split(r.Path, ".")
		for i, seg := range segs {
			name, variant, hasVariant, err := splitSegment(seg)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", r.Path, err)
			}
			last := i == len(segs)-1
			child := n.kids[name]
			if child == nil {
				if !last || hasVariant {
					return nil, fmt.Errorf("%s: %s has no row of its own", r.Path, name)
				}
				if n.kids == nil {
					n.kids = map[string]*fieldNode{}
				}
				child = &fieldNode{verdict: r.Verdict, reason: r.Reason}
				if r.Policy != "" {
					child.verdict = Modeled // the policy decides later (StoredContext)
				}
				n.kids[name] = child
				n = child
				continue
			}
			n = child
			if hasVariant {
				if n.byType == nil {
					n.byType = map[string]*fieldNode{}
				}
				v := n.byType[variant]
				if v == nil {
					if !last {
						return nil, fmt.Errorf("%s: variant %q has no row of its own", r.Path, variant)
					}
					v = &fieldNode{verdict: r.Verdict, reason: r.Reason, kids: map[string]*fieldNode{}}
					n.byType[variant] = v
				}
				n = v
			}
			if last && !hasVariant {
				return nil, fmt.Errorf("%s: listed twice", r.Path)
			}
		}
	}
	if m := root.kids["messages"]; m != nil && m.kids != nil {
		m.emptyOK = true // chat's and Anthropic's message objects
	}
	if kw := root.kids["chat_template_kwargs"]; kw != nil {
		kw.switches = true
	}
	return root, nil
}

// splitSegment reads "name", "name[]" or "name[type=x]".
func splitSegment(seg string) (name, variant string, hasVariant bool, err error) {
	i := strings.IndexByte(seg, '[')
	if i < 0 {
		return seg, "", false, nil
	}
	name, rest := seg[:i], seg[i:]
	switch {
	case rest == "[]":
		return name, "", false, nil
	case strings.HasPrefix(rest, "[type=") && strings.HasSuffix(rest, "]"):
		return name, rest[len("[type=") : len(rest)-1], true, nil
	}
	return "", "", false, fmt.Errorf("bad segment %q", seg)
}

// fieldPath is where the walk is, kept on the stack; a path string is built only for an error.
type fieldPath struct {
	segs [16]pathSeg
	n    int
}

type pathSeg struct {
	name string // a top-level key
	key  []byte // a raw key (name and key empty: an array index)
	idx  int
}

func (p *fieldPath) push(key []byte, idx int) {
	if p.n < len(p.segs) {
		p.segs[p.n] = pathSeg{key: key, idx: idx}
	}
	p.n++
}

func (p *fieldPath) pushName(name string) {
	if p.n < len(p.segs) {
		p.segs[p.n] = pathSeg{name: name}
	}
	p.n++
}

func (p *fieldPath) pop() { p.n-- }

func (p *fieldPath) String() string {
	var b strings.Builder
	for i := 0; i < min(p.n, len(p.segs)); i++ {
		s := p.segs[i]
		if s.name != "" {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.name)
			continue
		}
		if s.key == nil {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.idx))
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(unescapeKey(s.key))
	}
	return b.String()
}

// checkTopFields refuses (400 naming it) a top-level field the route's table has no row for, or
// whose row refuses it. It allocates nothing unless it refuses.
func checkTopFields(kind Kind, fields map[string]json.RawMessage) *apierr.Error {
	root := fieldTrees[kind]
	if root == nil {
		return apierr.BadRequest("", "Unsupported route.")
	}
	bad := false
	for k := range fields {
		n := root.kids[k]
		bad = bad || n == nil || n.verdict == Refused
	}
	if !bad {
		return nil
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		if n := root.kids[k]; n == nil || n.verdict == Refused {
			names = append(names, k)
		}
	}
	sort.Strings(names) // the same error every time
	k := names[0]
	if n := root.kids[k]; n != nil {
		return apierr.BadRequest(k, fmt.Sprintf("Field %q %s.", k, n.reason))
	}
	return apierr.BadRequest(k, fmt.Sprintf("Unsupported field %q for %s.", k, kind.Path()))
}

// checkNestedFields refuses (400 naming the path, such as messages[0].content[1].foo) a field
// inside any object the engine reads that the route's table has no row for, or whose row refuses
// it. fields are the body's top-level fields (valid JSON values, already checked by
// checkTopFields). It reads the values in place: no allocation unless it refuses.
func checkNestedFields(kind Kind, fields map[string]json.RawMessage) *apierr.Error {
	root := fieldTrees[kind]
	if root == nil {
		return nil
	}
	var p fieldPath
	for _, k := range nestedOrder[kind] {
		raw, ok := fields[k]
		if !ok {
			continue
		}
		n := root.kids[k]
		p.pushName(k)
		if e := walkValue(raw, skipSpace(raw, 0), n, &p); e != nil {
			return e
		}
		p.pop()
	}
	return nil
}

// nestedOrder lists each route's top-level fields whose objects are checked, in a fixed order.
var nestedOrder = func() (o [Kinds][]string) {
	for k := Kind(0); k < Kinds; k++ {
		if fieldTrees[k] == nil {
			continue
		}
		for name, n := range fieldTrees[k].kids {
			if n.checked() {
				o[k] = append(o[k], name)
			}
		}
		sort.Strings(o[k])
	}
	return o
}()

// walkValue checks the value at b[i] against n: an object's keys, or each object of an array.
func walkValue(b []byte, i int, n *fieldNode, p *fieldPath) *apierr.Error {
	if !n.checked() || i >= len(b) {
		return nil
	}
	switch b[i] {
	case '{':
		return walkObject(b, i, n, p)
	case '[':
		idx := 0
		i = skipSpace(b, i+1)
		for i < len(b) && b[i] != ']' {
			if b[i] == '{' {
				p.push(nil, idx)
				if e := walkObject(b, i, n, p); e != nil {
					return e
				}
				p.pop()
			}
			i = skipSpace(b, skipValue(b, i))
			if i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
			}
			idx++
		}
	}
	return nil
}

// walkObject checks the keys of the object at b[i]: n's own, or those of the variant its "type"
// names.
func walkObject(b []byte, i int, n *fieldNode, p *fieldPath) *apierr.Error {
	kids := n.kids
	if n.byType != nil {
		rawType, has := objectType(b, i)
		var v *fieldNode
		switch {
		case !has:
			v = n.byType[""]
		case bytes.IndexByte(rawType, '\\') < 0:
			v = n.byType[string(rawType)]
		default:
			v = n.byType[unescapeKey(rawType)]
		}
		if v == nil || v.verdict == Refused {
			where := p.String()
			typ := unescapeKey(rawType)
			if v != nil {
				// Named by the field that holds the part (messages[0].content), as before the table.
				return apierr.BadRequest(strings.TrimRightFunc(strings.TrimSuffix(where, "]"), func(r rune) bool { return r >= '0' && r <= '9' || r == '[' }),
					fmt.Sprintf("'%s' of type %q %s.", where, typ, v.reason))
			}
			if !has {
				return apierr.BadRequest(where, fmt.Sprintf("'%s' needs a 'type'.", where))
			}
			return apierr.BadRequest(where+".type", fmt.Sprintf("Unsupported type %q in '%s'.", typ, where))
		}
		kids = v.kids
	}
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		ke := stringEnd(b, i+1)
		if ke < 0 {
			return nil
		}
		rawKey := b[i+1 : ke]
		vs := skipSpace(b, skipSpace(b, ke+1)+1)
		ve := skipValue(b, vs)
		var kid *fieldNode
		if bytes.IndexByte(rawKey, '\\') >= 0 {
			kid = kids[unescapeKey(rawKey)]
		} else {
			kid = kids[string(rawKey)]
		}
		switch {
		case kid == nil:
			if !(n.emptyOK && emptyJSON(b[vs:ve])) && !n.switches {
				p.push(rawKey, 0)
				where := p.String()
				return apierr.BadRequest(where, fmt.Sprintf("Unsupported field '%s': the gateway does not know what the engine makes of it, so it could not be counted.", where))
			}
		case kid.verdict == Refused:
			p.push(rawKey, 0)
			where := p.String()
			return apierr.BadRequest(where, fmt.Sprintf("Field '%s' %s.", where, kid.reason))
		case kid.checked():
			p.push(rawKey, 0)
			if e := walkValue(b, vs, kid, p); e != nil {
				return e
			}
			p.pop()
		}
		i = skipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return nil
}

// objectType is the raw (still escaped) string value of the object's "type" key (b[i] is '{');
// false when there is none or it is null. A value that is not a string is returned whole (no
// variant has it).
func objectType(b []byte, i int) ([]byte, bool) {
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		ke := stringEnd(b, i+1)
		if ke < 0 {
			return nil, false
		}
		vs := skipSpace(b, skipSpace(b, ke+1)+1)
		ve := skipValue(b, vs)
		if string(b[i+1:ke]) == "type" || bytes.IndexByte(b[i+1:ke], '\\') >= 0 && unescapeKey(b[i+1:ke]) == "type" {
			v := b[vs:ve]
			switch {
			case isNull(v):
				return nil, false
			case len(v) >= 2 && v[0] == '"':
				return v[1 : len(v)-1], true
			}
			return v, true
		}
		i = skipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return nil, false
}

// FieldVerdicts lists the table of kind as path → verdict (with the reason of refused rows), in
// path order: for docs and tests.
func FieldVerdicts(kind Kind) []FieldRow {
	out := append([]FieldRow(nil), FieldTable[kind]...)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
