// Package request turns a client's body into one typed request, decoded once with one JSON
// library (goccy/go-json): the route kinds and their allow-lists, the key checks (no duplicate or
// case-variant keys an engine would read differently), the parse of every route into prompts to
// count and output to reserve, the canary marker spliced into the typed value, and the render of
// what the engine will tokenize. It knows nothing of HTTP or of engines.
package request

import (
	"bytes"
	"fmt"
	json "github.com/goccy/go-json"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/tokenize"
)

type Kind int

const (
	Chat Kind = iota
	Completions
	Generate
)

// Path is the route's URL path.
func (r Kind) Path() string { return paths[r] }

// Engine-control fields a client must never set (they steer the engine's KV transfer, identity,
// or code execution) and media fields: refused on every route by the field table (fields.go).
var engineControl = fieldNames(sharedRefused, reasonEngineControl)
var mediaFields = fieldNames(sharedRefused, reasonMedia)

// fieldNames are the paths of rows refused for reason.
func fieldNames(rs []FieldRow, reason string) map[string]bool {
	m := map[string]bool{}
	for _, r := range rs {
		if r.Reason == reason {
			m[r.Path] = true
		}
	}
	return m
}

// allowed are the top-level fields each route's table lets through (derived from FieldTable):
// everything else is refused with 400, so an unknown engine option can never slip through
// unreviewed.
var allowed = func() map[Kind]map[string]bool {
	m := map[Kind]map[string]bool{}
	for k, rs := range FieldTable {
		m[k] = map[string]bool{}
		for _, r := range rs {
			if !strings.ContainsAny(r.Path, ".[") && (r.Verdict != Refused || r.Policy != "") {
				m[k][r.Path] = true
			}
		}
	}
	return m
}()

// Allows reports whether kind's body may carry field.
func Allows(kind Kind, field string) bool { return allowed[kind][field] }

// AllowList is a set of allowed field names.
func AllowList(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Prompt is one sequence the engine will prefill (a batch has several).
type Prompt struct {
	// text is what the engine tokenizes (the chat template applied) when the prompt is text.
	Text string
	// IDs is the token count when the client sent token ids, Tokens the ids themselves (read
	// back into text for echo detection).
	IDs    int
	HasIDs bool
	Tokens []int
	// Templated: Text is the served model's own chat template rendering (RenderTemplate), which
	// holds every special token the engine counts.
	Templated bool
	// ImageTokens is what the prompt's images add to its count beyond Text (CountImages).
	ImageTokens int
}

// Request is a parsed, sanitized generation request.
type Request struct {
	Kind   Kind
	Fields map[string]json.RawMessage
	Stream bool
	// promptOne holds a chat's one prompt (Render): no slice of its own.
	promptOne [1]Prompt
	// output is the requested output tokens for the admission rule: × n, × best_of (completions),
	// × sampling_params.n (/generate).
	Output int
	// outputGiven says the client named an output length (the rule reserves output only then,
	// or from policy.default_max_tokens).
	OutputGiven bool
	// n is the number of sequences generated per prompt (n, best_of, sampling_params.n).
	N       int
	Prompts []Prompt
	Batch   bool
	Model   string

	// chat only: messages as sent, kept as raw fields so unknown-but-allowed keys survive, and
	// their decoded text (content, plus tool calls), so rendering does not decode them again.
	fast     bool // parsed by this package's scanner (parse)
	messages []map[string]json.RawMessage
	msgText  []string
	contents []string // the text of each message's content alone (msgText adds the extras)
	// roles and names of the messages, decoded once at parse time
	roles, names []string
	extra        string // tools / functions / response_format JSON, rendered into the prompt
	// modelSwitches are chat_template_kwargs keys beyond StandardSwitches: the served model's
	// template must read them (CheckTemplateSwitches).
	modelSwitches []string
	// texts for completions / generate: the prompt strings (nil when ids)
	texts []string
	// idsField names the field the prompt's token ids came from (for errors)
	idsField string
	// suffix: completions' fill-in-the-middle suffix, counted with every prompt
	suffix string

	// Responses and Messages: the system text (instructions / system) and the turns, rendered
	// with the chat template; storedContext names a field that extends the prompt from state
	// the gateway cannot see.
	system        string
	hasSystem     bool
	turns         []tokenize.Message
	StoredContext string
	// rerank / score: the query+document texts, one prompt each
	pairTexts []string

	// Images are the request's image parts in order (read at parse, charged by CountImages);
	// turnParts holds a Responses or Messages turn's content as a template that takes parts
	// receives it (nil for a turn without images).
	Images    []Image
	turnParts [][]any
}

// Parse validates body for kind. Errors are client errors (400) naming the field. The request
// keeps sub-slices of body (its fields' raw values): the caller must not change body afterwards.
func Parse(kind Kind, body []byte) (*Request, *apierr.Error) { return parse(kind, body, true) }

// parse is Parse; fast reads the object and the chat messages with the scanner of this package
// (values are sub-slices of body, keys interned), slow with the JSON library's decoder (every
// value copied); both read the same (TestFastParseEqualsDecoder).
func parse(kind Kind, body []byte, fast bool) (*Request, *apierr.Error) {
	if !utf8.Valid(body) {
		return nil, apierr.BadRequest("", "Request body is not valid UTF-8.")
	}
	var fields map[string]json.RawMessage
	if fast {
		fields = scanFields(body)
	}
	if fields == nil {
		var e *apierr.Error
		if fields, e = decodeFields(body); e != nil {
			return nil, e
		}
	}
	if e := CheckKeys(body); e != nil {
		return nil, e
	}
	if e := checkTopFields(kind, fields); e != nil {
		return nil, e
	}
	// Before the route's own reading: a field with no verdict is named by its whole path.
	if e := checkNestedFields(kind, fields); e != nil {
		return nil, e
	}
	r := &Request{Kind: kind, Fields: fields, fast: fast}
	if raw, ok := fields["stream"]; ok && !isNull(raw) {
		if !decodeBool(raw, &r.Stream) {
			return nil, apierr.BadRequest("stream", "'stream' must be a boolean.")
		}
	}
	if raw, ok := fields["model"]; ok && !isNull(raw) {
		if !decodeString(raw, &r.Model) {
			return nil, apierr.BadRequest("model", "'model' must be a string.")
		}
	}
	var err *apierr.Error
	switch kind {
	case Chat:
		err = r.parseChat()
	case Completions:
		err = r.parseCompletions()
	case Generate:
		err = r.parseGenerate()
	default:
		err = r.parseMore()
	}
	if err == nil {
		err = r.checkIDLists()
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// decodeFields reads body as one JSON object with the JSON library's decoder.
func decodeFields(body []byte) (map[string]json.RawMessage, *apierr.Error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return nil, apierr.BadRequest("", "Request body must be a JSON object: "+jsonErr(err))
	}
	if dec.More() {
		return nil, apierr.BadRequest("", "Request body has data after the JSON object.")
	}
	return fields, nil
}

func jsonErr(err error) string {
	if err == nil {
		return "null"
	}
	return err.Error()
}

// emptyJSON: null, "", [] or {} (raw is a valid JSON value). It allocates nothing.
func emptyJSON(raw json.RawMessage) bool {
	v := bytes.TrimSpace(raw)
	switch {
	case string(v) == "null", string(v) == `""`:
		return true
	case len(v) >= 2 && (v[0] == '[' && v[len(v)-1] == ']' || v[0] == '{' && v[len(v)-1] == '}'):
		return len(bytes.TrimSpace(v[1:len(v)-1])) == 0
	}
	return false
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// intField reads an optional non-negative integer field.
func intField(fields map[string]json.RawMessage, name string) (int, bool, *apierr.Error) {
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return 0, false, nil
	}
	var n int
	// The bound keeps products like max_tokens × n far from overflow.
	if !decodeInt(raw, &n) || n < 0 || n > 1<<30 {
		return 0, false, apierr.BadRequest(name, fmt.Sprintf("'%s' must be an integer from 0 to 2^30.", name))
	}
	return n, true, nil
}

// openAIOutput applies DESIGN.md's O for OpenAI routes: max_completion_tokens, else max_tokens; × n.
func (r *Request) openAIOutput() *apierr.Error {
	out, given, err := intField(r.Fields, "max_completion_tokens")
	if err != nil {
		return err
	}
	if !given {
		if out, given, err = intField(r.Fields, "max_tokens"); err != nil {
			return err
		}
	}
	n, hasN, err := intField(r.Fields, "n")
	if err != nil {
		return err
	}
	if hasN && n == 0 {
		return apierr.BadRequest("n", "'n' must be at least 1.")
	}
	if !hasN {
		n = 1
	}
	// Completions' best_of generates best_of sequences and returns n of them: the engine
	// reserves output for every one generated.
	if r.Kind == Completions {
		bestOf, has, err := intField(r.Fields, "best_of")
		if err != nil {
			return err
		}
		if has && bestOf == 0 {
			return apierr.BadRequest("best_of", "'best_of' must be at least 1.")
		}
		n = max(n, bestOf)
	}
	r.Output, r.OutputGiven, r.N = out*n, given, n
	return nil
}

func (r *Request) parseChat() *apierr.Error {
	raw, ok := r.Fields["messages"]
	if !ok {
		return apierr.BadRequest("messages", "'messages' is required.")
	}
	var ok2 bool
	if r.fast {
		r.messages, ok2 = scanMessages(raw)
	} else {
		ok2 = json.Unmarshal(raw, &r.messages) == nil
	}
	if !ok2 || len(r.messages) == 0 {
		return apierr.BadRequest("messages", "'messages' must be a non-empty array of message objects.")
	}
	n := len(r.messages)
	texts := make([]string, 4*n) // one allocation for the four lists (each capped at n)
	r.roles, r.names, r.contents, r.msgText = texts[:0:n], texts[n:n:2*n], texts[2*n:2*n:3*n], texts[3*n:3*n:4*n]
	for i, m := range r.messages {
		var unknown []string
		for k, v := range m {
			// Empty fields carry nothing to render (clients echo assistant messages back with
			// "refusal":null, "annotations":[]); anything else unknown could, and is refused.
			if !messageKeys[k] && !emptyJSON(v) {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			k := slices.Min(unknown) // the same one every time
			return apierr.BadRequest(fmt.Sprintf("messages[%d].%s", i, k), fmt.Sprintf("Unsupported message field %q.", k))
		}
		var role string
		if !decodeString(m["role"], &role) || role == "" {
			return apierr.BadRequest(fmt.Sprintf("messages[%d].role", i), "Each message needs a string 'role'.")
		}
		text, imgs, e := chatContent(fmt.Sprintf("messages[%d].content", i), m["content"])
		if e != nil {
			return e
		}
		r.Images = append(r.Images, imgs...)
		r.contents = append(r.contents, text)
		r.msgText = append(r.msgText, text+renderedExtras(m))
		var name string
		if raw, ok := m["name"]; ok && !isNull(raw) {
			if !decodeString(raw, &name) {
				return apierr.BadRequest(fmt.Sprintf("messages[%d].name", i), "'name' must be a string.")
			}
		}
		r.roles, r.names = append(r.roles, role), append(r.names, name)
	}
	if e := r.checkTemplateKwargs(r.Fields["chat_template_kwargs"]); e != nil {
		return e
	}
	// Tool definitions, schemas and template arguments reach the engine's template: count them.
	var extra []string
	for _, k := range []string{"tools", "functions", "response_format", "chat_template_kwargs", "reasoning_effort"} {
		if raw, ok := r.Fields[k]; ok && !isNull(raw) {
			extra = append(extra, string(raw))
		}
	}
	r.extra = strings.Join(extra, "\n")
	return r.openAIOutput()
}

// StandardSwitches are the chat_template_kwargs keys every model accepts: the switches chat
// templates read (Qwen3's enable_thinking, DeepSeek's thinking, gpt-oss's reasoning_effort). A
// model's own template may read more (CheckTemplateSwitches). Engines pass the object into
// apply_chat_template(**kwargs), so a key the template or apply_chat_template interprets can
// replace what the gateway counted: chat_template swaps the template itself (any prompt size from
// a short body), and messages, tools, documents, bos_token, add_generation_prompt,
// continue_final_message, tokenize or a special-token variable change the render. Those are
// refused by name (IsRefusedSwitch) whatever a template reads.
var StandardSwitches = AllowList("enable_thinking", "thinking", "reasoning_effort")

// refusedSwitches are the names the field table refuses inside chat_template_kwargs.
var refusedSwitches = func() map[string]bool {
	m := map[string]bool{}
	for _, r := range FieldTable[Chat] {
		if k, ok := strings.CutPrefix(r.Path, "chat_template_kwargs."); ok && r.Verdict == Refused {
			m[k] = true
		}
	}
	return m
}()

// IsRefusedSwitch says a chat_template_kwargs key is never accepted, whatever a model's template
// reads: apply_chat_template's own arguments, the template's inputs, and every special-token
// variable (*_token).
func IsRefusedSwitch(k string) bool {
	return refusedSwitches[k] || strings.HasSuffix(k, "_token") || strings.HasSuffix(k, "_tokens")
}

// maxSwitchString bounds a string switch's value: templates compare it with a few words.
const maxSwitchString = 32

// checkTemplateKwargs refuses chat_template_kwargs unless it is null or an object whose keys are
// not refused switches, with scalar values (a string at most maxSwitchString bytes). Keys other
// than StandardSwitches are kept in r.modelSwitches: CheckTemplateSwitches checks them against
// the served model's template.
func (r *Request) checkTemplateKwargs(raw json.RawMessage) *apierr.Error {
	if len(raw) == 0 || isNull(raw) {
		return nil
	}
	var kw map[string]json.RawMessage
	if json.Unmarshal(raw, &kw) != nil || kw == nil {
		return apierr.BadRequest("chat_template_kwargs", "'chat_template_kwargs' must be a JSON object.")
	}
	keys := make([]string, 0, len(kw))
	for k := range kw {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same error every time
	for _, k := range keys {
		field := "chat_template_kwargs." + k
		if IsRefusedSwitch(k) {
			return apierr.BadRequest(field, fmt.Sprintf("Template argument %q may not be set by clients: "+
				"chat_template_kwargs accepts only %s (and switches the model's own template reads).", k, strings.Join(sortedKeys(StandardSwitches), ", ")))
		}
		if !StandardSwitches[k] {
			r.modelSwitches = append(r.modelSwitches, k)
		}
		v := bytes.TrimSpace(kw[k])
		var s string
		var b bool
		switch {
		case isNull(v), decodeBool(v, &b):
		case decodeString(v, &s):
			if len(s) > maxSwitchString {
				return apierr.BadRequest(field, fmt.Sprintf("Template argument %q must be at most %d bytes.", k, maxSwitchString))
			}
		case len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9') && len(v) <= maxSwitchString:
			var f float64
			if json.Unmarshal(v, &f) != nil {
				return apierr.BadRequest(field, fmt.Sprintf("Template argument %q must be a boolean, a number or a short string.", k))
			}
		default:
			return apierr.BadRequest(field, fmt.Sprintf("Template argument %q must be a boolean, a number or a short string.", k))
		}
	}
	return nil
}

// ModelSwitches are the request's chat_template_kwargs keys beyond StandardSwitches.
func (r *Request) ModelSwitches() []string { return r.modelSwitches }

// CheckTemplateSwitches refuses (400 naming chat_template_kwargs.<key>) a template switch other
// than StandardSwitches that the served model does not accept (accepts nil: none).
func (r *Request) CheckTemplateSwitches(accepts func(string) bool) *apierr.Error {
	for _, k := range r.modelSwitches {
		if accepts == nil || !accepts(k) {
			return apierr.BadRequest("chat_template_kwargs."+k, fmt.Sprintf("Template argument %q is not a switch of this model's chat template: "+
				"chat_template_kwargs accepts only %s and the switches the model's own template reads.", k, strings.Join(sortedKeys(StandardSwitches), ", ")))
		}
	}
	return nil
}

// sortedKeys lists a set's names in order (for error messages and docs).
func sortedKeys(set map[string]bool) []string {
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// messageKeys are the message fields forwarded; anything else is refused, because whatever the
// engine's template renders must be counted.
var messageKeys = AllowList("role", "content", "name", "tool_calls", "tool_call_id", "function_call", "reasoning_content")

// renderedExtras is the text of a message's fields other than content that templates render
// (tool calls, reasoning): counted as their JSON, which is at least as long as their text.
func renderedExtras(m map[string]json.RawMessage) string {
	var b strings.Builder
	for _, k := range []string{"tool_calls", "function_call", "reasoning_content", "tool_call_id"} {
		if raw, ok := m[k]; ok && !isNull(raw) {
			b.WriteByte('\n')
			b.Write(raw)
		}
	}
	return b.String()
}

// messageText extracts the text of a message content: a string, null, or an array of text and
// image parts (chatContent; images carry no text).
func messageText(raw json.RawMessage) (string, error) {
	text, _, e := chatContent("content", raw)
	if e != nil {
		return "", fmt.Errorf("%s", e.Message)
	}
	return text, nil
}

// idsOrTexts parses a prompt field that may be a string, a list of strings, a list of token ids
// or a list of token-id lists.
func (r *Request) idsOrTexts(name string, raw json.RawMessage) *apierr.Error {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		r.texts = []string{s}
		return nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) > 0 {
		r.texts, r.Batch = ss, true
		return nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		r.idsField = name
		r.Prompts = []Prompt{{IDs: len(ids), HasIDs: true, Tokens: ids}}
		return nil
	}
	var batch [][]int
	if json.Unmarshal(raw, &batch) == nil && len(batch) > 0 {
		r.Batch = true
		r.idsField = name
		for _, b := range batch {
			r.Prompts = append(r.Prompts, Prompt{IDs: len(b), HasIDs: true, Tokens: b})
		}
		return nil
	}
	return apierr.BadRequest(name, fmt.Sprintf("'%s' must be a string, a non-empty list of strings, or token ids.", name))
}

// maxTokenID bounds token ids: no vocabulary is near 2^31, and engines keep ids in 32-bit
// tensors. SGLang reports no vocabulary size (neither /server_info nor /v1/models), so a tighter
// bound is the engine's to check.
const maxTokenID = 1<<31 - 1

// checkTokenIDs refuses ids no vocabulary has: negative ones index from the end of an engine's
// embedding table (or crash it), huge ones overflow it.
func checkTokenIDs(name string, ids []int) *apierr.Error {
	for i, id := range ids {
		if id < 0 || id > maxTokenID {
			return apierr.BadRequest(name, fmt.Sprintf("'%s' must hold token ids from 0 to %d; item %d is %d.", name, maxTokenID, i, id))
		}
	}
	return nil
}

// checkIDList applies checkTokenIDs to raw when it is a list of integers.
func checkIDList(name string, raw json.RawMessage) *apierr.Error {
	var ids []int
	if json.Unmarshal(raw, &ids) != nil {
		return nil
	}
	return checkTokenIDs(name, ids)
}

// idListFields are the other fields that carry token ids, by route: checked like prompts when
// they are lists of integers (anything else is the engine's to refuse).
var idListFields = map[Kind][]string{
	Chat:        {"stop_token_ids"},
	Completions: {"stop_token_ids"},
	Score:       {"label_token_ids"},
}

// checkIDLists applies checkTokenIDs to the prompt's token ids, the route's other token-id fields
// and /generate's sampling_params.stop_token_ids.
func (r *Request) checkIDLists() *apierr.Error {
	for i, p := range r.Prompts {
		if !p.HasIDs {
			continue
		}
		name := r.idsField
		if r.Batch {
			name = fmt.Sprintf("%s[%d]", name, i)
		}
		if e := checkTokenIDs(name, p.Tokens); e != nil {
			return e
		}
	}
	check := func(name string, raw json.RawMessage) *apierr.Error {
		if len(raw) == 0 {
			return nil
		}
		return checkIDList(name, raw)
	}
	for _, k := range idListFields[r.Kind] {
		if e := check(k, r.Fields[k]); e != nil {
			return e
		}
	}
	if r.Kind == Generate {
		var sp map[string]json.RawMessage
		if json.Unmarshal(r.Fields["sampling_params"], &sp) == nil {
			return check("sampling_params.stop_token_ids", sp["stop_token_ids"])
		}
	}
	return nil
}

func (r *Request) parseCompletions() *apierr.Error {
	raw, ok := r.Fields["prompt"]
	if !ok || isNull(raw) {
		return apierr.BadRequest("prompt", "'prompt' is required.")
	}
	if err := r.idsOrTexts("prompt", raw); err != nil {
		return err
	}
	if raw, ok := r.Fields["suffix"]; ok && !isNull(raw) {
		// A fill-in-the-middle template renders the suffix into the prompt: count it.
		if json.Unmarshal(raw, &r.suffix) != nil {
			return apierr.BadRequest("suffix", "'suffix' must be a string.")
		}
	}
	return r.openAIOutput()
}

func (r *Request) parseGenerate() *apierr.Error {
	text, hasText := r.Fields["text"]
	ids, hasIDs := r.Fields["input_ids"]
	hasText, hasIDs = hasText && !isNull(text), hasIDs && !isNull(ids)
	switch {
	case hasText && hasIDs:
		return apierr.BadRequest("input_ids", "Give either 'text' or 'input_ids', not both.")
	case hasText:
		if err := r.idsOrTexts("text", text); err != nil || r.texts == nil {
			return apierr.BadRequest("text", "'text' must be a string or a non-empty list of strings.")
		}
	case hasIDs:
		if err := r.idsOrTexts("input_ids", ids); err != nil || r.texts != nil {
			return apierr.BadRequest("input_ids", "'input_ids' must be a list of token ids or a list of such lists.")
		}
	default:
		return apierr.BadRequest("text", "'text' or 'input_ids' is required.")
	}
	r.Output = 128 // SGLang's default max_new_tokens
	r.OutputGiven = true
	if raw, ok := r.Fields["sampling_params"]; ok && !isNull(raw) {
		var sp map[string]json.RawMessage
		if err := json.Unmarshal(raw, &sp); err != nil {
			return apierr.BadRequest("sampling_params", "'sampling_params' must be an object.")
		}
		if err := checkSamplingKeys(sp); err != nil {
			return err
		}
		n, given, err := intField(sp, "max_new_tokens")
		if err != nil {
			return apierr.BadRequest("sampling_params.max_new_tokens", "'sampling_params.max_new_tokens' must be a non-negative integer.")
		}
		if given {
			r.Output = n
		}
		if raw, ok := sp["n"]; ok && !isNull(raw) {
			var k int
			if json.Unmarshal(raw, &k) != nil || k < 1 || k > 1<<30 {
				return apierr.BadRequest("sampling_params.n", "'sampling_params.n' must be a positive integer.")
			}
			r.Output *= k
			r.N = k
		}
	}
	return nil
}

// samplingKeys are the fields of SGLang's SamplingParams that callers set (sglang
// python/sglang/srt/sampling/sampling_params.py), matched exactly as the engine matches them.
// custom_params is left out: it feeds custom logit processors, engine-side code this gateway
// refuses (like custom_logit_processor).
var samplingKeys = AllowList("max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "stop_regex",
	"temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
	"repetition_penalty", "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
	"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
	"logit_bias", "sampling_seed",
	// SGLang's cap on reasoning tokens: they count inside max_new_tokens (inert, issue 39).
	"thinking_budget")

func checkSamplingKeys(sp map[string]json.RawMessage) *apierr.Error {
	names := make([]string, 0, len(sp))
	for k := range sp {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		switch {
		case k == "custom_params":
			return apierr.BadRequest("sampling_params.custom_params", "Field 'sampling_params.custom_params' feeds custom logit processors and may not be set by clients.")
		case !samplingKeys[k]:
			return apierr.BadRequest("sampling_params."+k, fmt.Sprintf("Unsupported sampling parameter %q (names are case-sensitive).", k))
		}
	}
	return nil
}

// render builds the prompts the engine will see (after any injection) and writes the changed
// fields back into the body.
func (r *Request) Render() {
	switch r.Kind {
	case Chat:
		var mb [8]tokenize.Message // a short conversation's, on the stack
		msgs := mb[:0]
		for i := range r.messages {
			msgs = append(msgs, tokenize.Message{Role: r.roles[i], Name: r.names[i], Content: r.msgText[i]})
		}
		r.promptOne[0] = Prompt{Text: tokenize.RenderChatML(msgs, r.extra)}
		r.Prompts = r.promptOne[:]
	case Responses, Messages:
		r.Prompts = []Prompt{{Text: r.renderTurns()}}
	default:
		if r.texts != nil {
			r.Prompts = r.Prompts[:0]
			for _, t := range r.texts {
				if r.suffix != "" {
					t += "\n" + r.suffix
				}
				r.Prompts = append(r.Prompts, Prompt{Text: t})
			}
		}
	}
}

// setTexts replaces the prompt texts (completions prompt / generate text) in the body.
func (r *Request) setTexts(texts []string) {
	r.texts = texts
	field := "prompt"
	if r.Kind == Generate {
		field = "text"
	}
	if r.Batch {
		r.Fields[field] = mustJSON(texts)
	} else {
		r.Fields[field] = mustJSON(texts[0])
	}
}

// setMessages replaces the chat messages in the body.
func (r *Request) setMessages(msgs []map[string]json.RawMessage) {
	r.messages = msgs
	r.msgText, r.contents = r.msgText[:0], r.contents[:0]
	for _, m := range msgs {
		t, _ := messageText(m["content"]) // built from validated parts
		r.contents = append(r.contents, t)
		r.msgText = append(r.msgText, t+renderedExtras(m))
	}
	r.Fields["messages"] = mustJSON(msgs)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only values that came from json.Unmarshal are marshalled here
	}
	return b
}
