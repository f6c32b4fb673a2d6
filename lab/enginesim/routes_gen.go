package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

// maxSalts bounds the distinct-salt set; beyond it cache_salts is a lower bound.
const maxSalts = 1 << 16

// noteSalts records cache_salt values (and /generate's extra_key, and an honoured X-Cache-Salt
// header): /sim/stats counts the distinct ones, enough for a test to see that a gateway sets one
// per tenant. The prefix cache (prefixcache.go) is what the salt partitions.
func (s *Server) noteSalts(salts []string) {
	s.statsMu.Lock()
	for _, v := range salts {
		if v != "" && len(s.salts) < maxSalts {
			s.salts[v] = struct{}{}
		}
	}
	s.statsMu.Unlock()
}

// runOne runs a single item through runAll (so PD, the bug and the fixes
// behave exactly as on /v1/chat/completions). On failure it writes the
// error with fail and returns ok=false; otherwise the caller owns done.
func (s *Server) runOne(ctx *fasthttp.RequestCtx, it *wire.Item, fail func(*outcome)) (o *outcome, rctx context.Context, done func(), ok bool) {
	s.headerSalt(ctx, []*wire.Item{it})
	outs, rctx, done := s.runAll([]*wire.Item{it})
	if f := firstFailure(outs); f != nil {
		done()
		fail(f)
		return nil, nil, nil, false
	}
	s.setTruthHeaders(ctx, outs)
	return outs[0], rctx, done, true
}

// ---- /v1/responses ----

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

func (s *Server) handleResponses(ctx *fasthttp.RequestCtx) {
	s.countRequest("/v1/responses")
	bad := func(err error) {
		s.reject("bad_request")
		writeOpenAIError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
	}
	var req wire.ResponsesReq
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		bad(wire.Badf("invalid JSON body: %v", err))
		return
	}
	roles, contents, err := wire.ResponsesInput(req.Input)
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
	maxNew, given := wire.DefaultOpenAIMaxTokens, false
	if req.MaxOutputTokens != nil {
		if *req.MaxOutputTokens < 0 {
			bad(wire.Badf("max_output_tokens must not be negative"))
			return
		}
		maxNew, given = *req.MaxOutputTokens, true
	}
	it, err := wire.SingleItem(s.env, wire.RenderChatML(pr, pc), maxNew, given, req.EngineFields, req.User)
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
	id, msgID := "resp_"+it.RID, "msg_"+it.RID
	resp := wire.Response{ID: id, Object: "response", CreatedAt: time.Now().Unix(), Model: model, Status: "in_progress",
		Output: []wire.RespOutput{}, Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens,
		ParallelToolCalls: true, ToolChoice: "auto", Tools: []any{}}
	if req.PreviousResponseID != "" {
		resp.PreviousResponseID = &req.PreviousResponseID
	}
	// finish completes the response object and stores the conversation.
	finish := func(text string) wire.Response {
		r := resp
		r.Status = "completed"
		r.Output = []wire.RespOutput{{Type: "message", ID: msgID, Status: "completed", Role: "assistant",
			Content: []wire.RespContent{{Type: "output_text", Text: text, Annotations: []any{}}}}}
		n := len(o.gen.IDs)
		r.Usage = &wire.RespUsage{InputTokens: o.promptTokens, OutputTokens: n, TotalTokens: o.promptTokens + n,
			InputTokensDetails: map[string]int{"cached_tokens": o.cached}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}}
		if req.Store == nil || *req.Store {
			s.responses.put(id, conversation{roles: append(append([]string(nil), conv.roles...), "assistant"),
				contents: append(append([]string(nil), conv.contents...), text)})
		}
		return r
	}
	if !req.Stream {
		s.pace(rctx, []*outcome{o})
		done()
		wire.WriteJSON(ctx, finish(strings.Join(o.gen.Texts, "")))
		return
	}
	delay := s.cfg.TokenDelay
	wire.WriteStream(ctx, func(w *bufio.Writer) error {
		defer done()
		seq := 0
		ev := func(typ string, fields map[string]any) error {
			fields["type"], fields["sequence_number"] = typ, seq
			seq++
			return wire.SSEEvent(w, typ, fields)
		}
		msgItem := wire.RespOutput{Type: "message", ID: msgID, Status: "in_progress", Role: "assistant", Content: []wire.RespContent{}}
		part := wire.RespContent{Type: "output_text", Annotations: []any{}}
		if err := ev("response.created", map[string]any{"response": resp}); err != nil {
			return err
		}
		// The SDKs' stream accumulators need the item and part to exist before deltas.
		if err := ev("response.output_item.added", map[string]any{"output_index": 0, "item": msgItem}); err != nil {
			return err
		}
		if err := ev("response.content_part.added", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part}); err != nil {
			return err
		}
		var text strings.Builder
		for _, t := range o.gen.Texts {
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

func (s *Server) parseAnthropic(ctx *fasthttp.RequestCtx) (*wire.AnthropicReq, string, bool) {
	var req wire.AnthropicReq
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		s.reject("bad_request")
		writeAnthropicError(ctx, errOutcome(400, "invalid JSON body: "+err.Error()))
		return nil, "", false
	}
	prompt, err := wire.AnthropicPrompt(&req)
	if err != nil {
		s.reject("bad_request")
		writeAnthropicError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return nil, "", false
	}
	return &req, prompt, true
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
	it, err := wire.SingleItem(s.env, prompt, *req.MaxTokens, true, req.EngineFields, tenant)
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
			return wire.Strp("max_tokens")
		}
		return wire.Strp("end_turn")
	}
	msg := wire.AnthropicMessage{ID: "msg_" + it.RID, Type: "message", Role: "assistant", Content: []wire.AnthropicContent{}, Model: model,
		Usage: wire.AnthropicUsage{InputTokens: o.promptTokens}}
	if !req.Stream {
		s.pace(rctx, []*outcome{o})
		done()
		msg.Content = []wire.AnthropicContent{{Type: "text", Text: strings.Join(o.gen.Texts, "")}}
		msg.StopReason, msg.Usage.OutputTokens = stopReason(), len(o.gen.IDs)
		wire.WriteJSON(ctx, msg)
		return
	}
	delay := s.cfg.TokenDelay
	wire.WriteStream(ctx, func(w *bufio.Writer) error {
		defer done()
		if err := wire.SSEEvent(w, "message_start", map[string]any{"type": "message_start", "message": msg}); err != nil {
			return err
		}
		if err := wire.SSEEvent(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": wire.AnthropicContent{Type: "text"}}); err != nil {
			return err
		}
		n := 0
		for _, t := range o.gen.Texts {
			if !sleepCtx(rctx, delay) {
				o.finish = "abort"
				break
			}
			n++
			if err := wire.SSEEvent(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "text_delta", "text": t}}); err != nil {
				return err
			}
		}
		if err := wire.SSEEvent(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}); err != nil {
			return err
		}
		if err := wire.SSEEvent(w, "message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": stopReason(), "stop_sequence": nil}, "usage": map[string]any{"output_tokens": n}}); err != nil {
			return err
		}
		return wire.SSEEvent(w, "message_stop", map[string]any{"type": "message_stop"})
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
	wire.WriteJSON(ctx, map[string]int{"input_tokens": len(ids)})
}
