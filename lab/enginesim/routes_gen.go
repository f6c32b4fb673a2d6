package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// engineFields are the SGLang extensions every generation body may carry:
// the request id, the PD bootstrap fields and the prefix-cache salt.
type engineFields struct {
	RID           json.RawMessage `json:"rid"`
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
	CacheSalt     json.RawMessage `json:"cache_salt"`
}

// maxSalts bounds the distinct-salt set; beyond it cache_salts is a lower bound.
const maxSalts = 1 << 16

// noteSalt records cache_salt values. The simulator has no prefix cache to
// partition, so it only counts distinct salts: enough for a test to see
// that a gateway sets one per tenant.
func (s *Server) noteSalt(raw json.RawMessage) error { return s.noteSaltAs(raw, "cache_salt") }

// noteSaltAs is noteSalt for a field of another name (/generate's extra_key).
func (s *Server) noteSaltAs(raw json.RawMessage, field string) error {
	salts, _, err := strings1(raw, field)
	if err != nil {
		return err
	}
	s.statsMu.Lock()
	for _, v := range salts {
		if v != "" && len(s.salts) < maxSalts {
			s.salts[v] = struct{}{}
		}
	}
	s.statsMu.Unlock()
	return nil
}

// singleItem builds the one item of a chat-like route (one rendered prompt).
func (s *Server) singleItem(prompt string, maxNew int, given bool, f engineFields, tenant string) (*item, error) {
	if err := s.noteSalt(f.CacheSalt); err != nil {
		return nil, err
	}
	rids, _, err := strings1(f.RID, "rid")
	if err != nil {
		return nil, err
	}
	boots, err := bootFields(f.BootstrapHost, f.BootstrapPort, f.BootstrapRoom, 1)
	if err != nil {
		return nil, err
	}
	it := &item{prompt: prompt, maxNew: maxNew, maxNewGiven: given, boot: boots[0], tenant: tenant}
	if len(rids) > 0 {
		it.rid = rids[0]
	}
	if it.rid == "" {
		it.rid = s.newRID()
	}
	return it, nil
}

// runOne runs a single item through runAll (so PD, the bug and the fixes
// behave exactly as on /v1/chat/completions). On failure it writes the
// error with fail and returns ok=false; otherwise the caller owns done.
func (s *Server) runOne(ctx *fasthttp.RequestCtx, it *item, fail func(*outcome)) (o *outcome, rctx context.Context, done func(), ok bool) {
	outs, rctx, done := s.runAll([]*item{it})
	if f := firstFailure(outs); f != nil {
		done()
		fail(f)
		return nil, nil, nil, false
	}
	s.setTruthHeaders(ctx, outs)
	return outs[0], rctx, done, true
}

// sseEvent writes one "event: NAME\ndata: JSON\n\n" frame and flushes it.
func sseEvent(w *bufio.Writer, name string, v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	w.WriteString("event: ")
	w.WriteString(name)
	w.WriteString("\ndata: ")
	w.Write(b)
	w.WriteString("\n\n")
	return w.Flush()
}

// ---- /v1/responses ----

type responsesReq struct {
	engineFields
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	User               string          `json:"user"`
}

// conversation is what /v1/responses stores per response id, so that a
// later previous_response_id extends the prompt with it (instructions are
// not carried over, as in OpenAI's API).
type conversation struct {
	roles, contents []string
}

// maxStoredResponses bounds the in-memory store; the oldest id goes first.
const maxStoredResponses = 4096

type responseStore struct {
	mu    sync.Mutex
	m     map[string]conversation
	order []string
}

func (rs *responseStore) get(id string) (conversation, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	c, ok := rs.m[id]
	return c, ok
}

func (rs *responseStore) put(id string, c conversation) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.m[id]; !ok {
		rs.order = append(rs.order, id)
	}
	rs.m[id] = c
	for len(rs.order) > maxStoredResponses {
		delete(rs.m, rs.order[0])
		rs.order = rs.order[1:]
	}
}

// responsesInput decodes input: a string (one user message) or a list of
// message items whose content is a string or input_text/output_text parts.
func responsesInput(raw json.RawMessage) (roles, contents []string, err error) {
	if isNull(raw) {
		return nil, nil, badf("input is required")
	}
	if !isArray(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, nil, badf("input: want a string or a list of items")
		}
		return []string{"user"}, []string{s}, nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, nil, badf("input: want a string or a list of items")
	}
	for i, it := range items {
		if it.Type != "" && it.Type != "message" {
			return nil, nil, badf("input[%d]: only message items are supported, got %q", i, it.Type)
		}
		if it.Role == "" {
			return nil, nil, badf("input[%d].role is required", i)
		}
		text, err := partsText(it.Content, "input[].content", "input_text", "output_text")
		if err != nil {
			return nil, nil, err
		}
		roles, contents = append(roles, it.Role), append(contents, text)
	}
	if len(roles) == 0 {
		return nil, nil, badf("input: at least one item is required")
	}
	return roles, contents, nil
}

// partsText reads content that is a string or a list of {"type","text"}
// parts whose type is one of types.
func partsText(raw json.RawMessage, field string, types ...string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	if !isArray(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badf("%s: want a string or a list of parts", field)
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badf("%s: want a string or a list of parts", field)
	}
	var b strings.Builder
	for _, p := range parts {
		known := false
		for _, t := range types {
			known = known || p.Type == t
		}
		if !known || p.Text == nil {
			return "", badf("%s: only %s parts are supported, got %q", field, strings.Join(types, "/"), p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

type respContent struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type respOutput struct {
	Type    string        `json:"type"`
	ID      string        `json:"id"`
	Status  string        `json:"status"`
	Role    string        `json:"role"`
	Content []respContent `json:"content"`
}

type respUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

type responseOut struct {
	ID                 string       `json:"id"`
	Object             string       `json:"object"`
	CreatedAt          int64        `json:"created_at"`
	Model              string       `json:"model"`
	Status             string       `json:"status"`
	Output             []respOutput `json:"output"`
	Usage              *respUsage   `json:"usage"`
	Instructions       *string      `json:"instructions"`
	MaxOutputTokens    *int         `json:"max_output_tokens"`
	PreviousResponseID *string      `json:"previous_response_id"`
	Error              any          `json:"error"`
	IncompleteDetails  any          `json:"incomplete_details"`
	ParallelToolCalls  bool         `json:"parallel_tool_calls"`
	ToolChoice         string       `json:"tool_choice"`
	Tools              []any        `json:"tools"`
}

func (s *Server) handleResponses(ctx *fasthttp.RequestCtx) {
	s.countRequest("/v1/responses")
	bad := func(err error) {
		s.reject("bad_request")
		writeOpenAIError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
	}
	var req responsesReq
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		bad(badf("invalid JSON body: %v", err))
		return
	}
	roles, contents, err := responsesInput(req.Input)
	if err != nil {
		bad(err)
		return
	}
	var conv conversation
	if req.PreviousResponseID != "" {
		prev, ok := s.responses.get(req.PreviousResponseID)
		if !ok {
			s.reject("not_found")
			o := errOutcome(404, "Previous response with id '"+req.PreviousResponseID+"' not found.")
			o.errType = "NotFoundError"
			writeOpenAIError(ctx, o)
			return
		}
		conv.roles = append(conv.roles, prev.roles...)
		conv.contents = append(conv.contents, prev.contents...)
	}
	conv.roles = append(conv.roles, roles...)
	conv.contents = append(conv.contents, contents...)
	pr, pc := conv.roles, conv.contents
	if req.Instructions != nil {
		// Instructions render as a leading system message, as chat would.
		pr = append([]string{"system"}, pr...)
		pc = append([]string{*req.Instructions}, pc...)
	}
	maxNew, given := defaultOpenAIMaxTokens, false
	if req.MaxOutputTokens != nil {
		if *req.MaxOutputTokens < 0 {
			bad(badf("max_output_tokens must not be negative"))
			return
		}
		maxNew, given = *req.MaxOutputTokens, true
	}
	it, err := s.singleItem(RenderChatML(pr, pc), maxNew, given, req.engineFields, req.User)
	if err != nil {
		bad(err)
		return
	}
	o, rctx, done, ok := s.runOne(ctx, it, func(f *outcome) { writeOpenAIError(ctx, f) })
	if !ok {
		return
	}
	model := req.Model
	if model == "" {
		model = s.cfg.Model
	}
	id, msgID := "resp_"+it.rid, "msg_"+it.rid
	resp := responseOut{ID: id, Object: "response", CreatedAt: time.Now().Unix(), Model: model, Status: "in_progress",
		Output: []respOutput{}, Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens,
		ParallelToolCalls: true, ToolChoice: "auto", Tools: []any{}}
	if req.PreviousResponseID != "" {
		resp.PreviousResponseID = &req.PreviousResponseID
	}
	// finish completes the response object and stores the conversation.
	finish := func(text string) responseOut {
		r := resp
		r.Status = "completed"
		r.Output = []respOutput{{Type: "message", ID: msgID, Status: "completed", Role: "assistant",
			Content: []respContent{{Type: "output_text", Text: text, Annotations: []any{}}}}}
		n := len(o.gen.ids)
		r.Usage = &respUsage{InputTokens: o.promptTokens, OutputTokens: n, TotalTokens: o.promptTokens + n,
			InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}}
		if req.Store == nil || *req.Store {
			s.responses.put(id, conversation{roles: append(append([]string(nil), conv.roles...), "assistant"),
				contents: append(append([]string(nil), conv.contents...), text)})
		}
		return r
	}
	if !req.Stream {
		s.pace(rctx, []*outcome{o})
		done()
		writeJSON(ctx, finish(strings.Join(o.gen.texts, "")))
		return
	}
	delay := s.cfg.TokenDelay
	writeStream(ctx, func(w *bufio.Writer) error {
		defer done()
		seq := 0
		ev := func(typ string, fields map[string]any) error {
			fields["type"], fields["sequence_number"] = typ, seq
			seq++
			return sseEvent(w, typ, fields)
		}
		item := respOutput{Type: "message", ID: msgID, Status: "in_progress", Role: "assistant", Content: []respContent{}}
		part := respContent{Type: "output_text", Annotations: []any{}}
		if err := ev("response.created", map[string]any{"response": resp}); err != nil {
			return err
		}
		// The SDKs' stream accumulators need the item and part to exist before deltas.
		if err := ev("response.output_item.added", map[string]any{"output_index": 0, "item": item}); err != nil {
			return err
		}
		if err := ev("response.content_part.added", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part}); err != nil {
			return err
		}
		var text strings.Builder
		for _, t := range o.gen.texts {
			if !sleepCtx(rctx, delay) {
				o.finish = "abort"
				break
			}
			text.WriteString(t)
			if err := ev("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "delta": t}); err != nil {
				return err
			}
		}
		final := finish(text.String())
		part.Text = text.String()
		if err := ev("response.output_text.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "text": part.Text}); err != nil {
			return err
		}
		if err := ev("response.content_part.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part}); err != nil {
			return err
		}
		if err := ev("response.output_item.done", map[string]any{"output_index": 0, "item": final.Output[0]}); err != nil {
			return err
		}
		return ev("response.completed", map[string]any{"response": final})
	})
}

// ---- Anthropic /v1/messages ----

type anthropicReq struct {
	engineFields
	Model     string          `json:"model"`
	System    json.RawMessage `json:"system"`
	Messages  []chatMessage   `json:"messages"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	Metadata  *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

// anthropicPrompt renders system (a string or text blocks) as a system
// message, then the user/assistant messages, as chat does.
func anthropicPrompt(req *anthropicReq) (string, error) {
	if len(req.Messages) == 0 {
		return "", badf("messages: at least one message is required")
	}
	var roles, contents []string
	if !isNull(req.System) {
		sys, err := partsText(req.System, "system", "text")
		if err != nil {
			return "", err
		}
		roles, contents = append(roles, "system"), append(contents, sys)
	}
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return "", badf("messages.%d.role: Input should be 'user' or 'assistant'", i)
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

func writeAnthropicError(ctx *fasthttp.RequestCtx, o *outcome) {
	b, _ := marshal(map[string]any{"type": "error", "error": map[string]any{"type": anthropicErrType(o.status), "message": o.msg}})
	ctx.SetStatusCode(o.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (s *Server) parseAnthropic(ctx *fasthttp.RequestCtx) (*anthropicReq, string, bool) {
	var req anthropicReq
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		s.reject("bad_request")
		writeAnthropicError(ctx, errOutcome(400, "invalid JSON body: "+err.Error()))
		return nil, "", false
	}
	prompt, err := anthropicPrompt(&req)
	if err != nil {
		s.reject("bad_request")
		writeAnthropicError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return nil, "", false
	}
	return &req, prompt, true
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type anthropicMsg struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Content      []respContentA `json:"content"`
	Model        string         `json:"model"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type respContentA struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func (s *Server) handleMessages(ctx *fasthttp.RequestCtx) {
	s.countRequest("/v1/messages")
	req, prompt, ok := s.parseAnthropic(ctx)
	if !ok {
		return
	}
	bad := func(msg string) {
		s.reject("bad_request")
		writeAnthropicError(ctx, errOutcome(400, msg))
	}
	if req.MaxTokens == nil {
		bad("max_tokens: Field required")
		return
	}
	if *req.MaxTokens < 1 {
		bad("max_tokens: must be greater than or equal to 1")
		return
	}
	tenant := ""
	if req.Metadata != nil {
		tenant = req.Metadata.UserID
	}
	it, err := s.singleItem(prompt, *req.MaxTokens, true, req.engineFields, tenant)
	if err != nil {
		bad(strings.TrimPrefix(err.Error(), "bad request: "))
		return
	}
	o, rctx, done, ok := s.runOne(ctx, it, func(f *outcome) { writeAnthropicError(ctx, f) })
	if !ok {
		return
	}
	model := req.Model
	if model == "" {
		model = s.cfg.Model
	}
	stopReason := func() *string {
		if o.finish == "length" {
			return strp("max_tokens")
		}
		return strp("end_turn")
	}
	msg := anthropicMsg{ID: "msg_" + it.rid, Type: "message", Role: "assistant", Content: []respContentA{}, Model: model,
		Usage: anthropicUsage{InputTokens: o.promptTokens}}
	if !req.Stream {
		s.pace(rctx, []*outcome{o})
		done()
		msg.Content = []respContentA{{Type: "text", Text: strings.Join(o.gen.texts, "")}}
		msg.StopReason, msg.Usage.OutputTokens = stopReason(), len(o.gen.ids)
		writeJSON(ctx, msg)
		return
	}
	delay := s.cfg.TokenDelay
	writeStream(ctx, func(w *bufio.Writer) error {
		defer done()
		if err := sseEvent(w, "message_start", map[string]any{"type": "message_start", "message": msg}); err != nil {
			return err
		}
		if err := sseEvent(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": respContentA{Type: "text"}}); err != nil {
			return err
		}
		n := 0
		for _, t := range o.gen.texts {
			if !sleepCtx(rctx, delay) {
				o.finish = "abort"
				break
			}
			n++
			if err := sseEvent(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "text_delta", "text": t}}); err != nil {
				return err
			}
		}
		if err := sseEvent(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}); err != nil {
			return err
		}
		if err := sseEvent(w, "message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": stopReason(), "stop_sequence": nil}, "usage": map[string]any{"output_tokens": n}}); err != nil {
			return err
		}
		return sseEvent(w, "message_stop", map[string]any{"type": "message_stop"})
	})
}

// handleCountTokens answers /v1/messages/count_tokens with the rendered
// prompt's length: no admission, nothing is allocated.
func (s *Server) handleCountTokens(ctx *fasthttp.RequestCtx) {
	s.countRequest("/v1/messages/count_tokens")
	_, prompt, ok := s.parseAnthropic(ctx)
	if !ok {
		return
	}
	ids, _ := s.tok.Encode(prompt)
	writeJSON(ctx, map[string]int{"input_tokens": len(ids)})
}
