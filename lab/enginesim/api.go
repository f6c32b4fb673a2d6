package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

// Reply headers that tell tests the ground truth.
const (
	// HeaderForeign names (comma-separated) the requests, other than this
	// one, that last wrote a slot of the context this reply attended to;
	// empty when the reply read only its own prompt.
	HeaderForeign = "X-Sim-Foreign-Requests"
	// HeaderQuoted names the foreign requests whose text the reply quotes.
	HeaderQuoted = "X-Sim-Quoted-Requests"
	// HeaderCacheSalt is the request header form of the prefix-cache salt (vllm#57609),
	// honoured with Config.SaltHeader.
	HeaderCacheSalt = "X-Cache-Salt"
)

// ---- /generate ----

func (o *outcome) finishObj(n int) *wire.FinishObj {
	switch o.finish {
	case "abort":
		return &wire.FinishObj{Type: "abort", Message: o.msg}
	case "stop":
		return &wire.FinishObj{Type: "stop"}
	}
	return &wire.FinishObj{Type: "length", Length: n}
}

func (s *Server) handleGenerate(ctx *fasthttp.RequestCtx) {
	s.countRequest("/generate")
	items, batch, stream, err := wire.ParseGenerate(s.env, ctx.PostBody())
	if err != nil {
		s.reject("bad_request")
		writeGenerateError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return
	}
	s.headerSalt(ctx, items)
	outs, rctx, done := s.runAll(items)
	if f := firstFailure(outs); f != nil {
		done()
		writeGenerateError(ctx, f)
		return
	}
	s.setTruthHeaders(ctx, outs)
	if !stream {
		s.pace(rctx, outs)
		done()
		var body []byte
		if batch {
			replies := make([]wire.GenReply, len(outs))
			for i, o := range outs {
				replies[i] = s.genFinal(items[i].RID, o)
			}
			body, _ = wire.Marshal(replies)
		} else {
			body, _ = wire.Marshal(s.genFinal(items[0].RID, outs[0]))
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		return
	}
	delay := s.cfg.TokenDelay
	wire.WriteStream(ctx, func(w *bufio.Writer) error {
		defer done()
		for i, o := range outs {
			var idx *int
			if batch {
				idx = &i
			}
			var cum strings.Builder
			n := len(o.gen.IDs)
			for k := 0; k < n; k++ {
				if !sleepCtx(rctx, delay) {
					o.finish, o.msg = "abort", "Abort request"
					break
				}
				cum.WriteString(o.gen.Texts[k])
				ev := wire.GenReply{Text: cum.String(), OutputIDs: o.gen.IDs[:k+1], Index: idx,
					MetaInfo: wire.GenMeta{ID: items[i].RID, PromptTokens: o.promptTokens, CompletionTokens: k + 1, CachedTokens: s.cachedOf(o)}}
				if k == n-1 {
					ev.MetaInfo.FinishReason = o.finishObj(n)
				}
				if err := wire.WriteEvent(w, ev); err != nil {
					return err
				}
			}
			if n == 0 || o.finish == "abort" {
				ev := wire.GenReply{Text: cum.String(), OutputIDs: o.gen.IDs[:min(n, len(o.gen.IDs))], Index: idx,
					MetaInfo: wire.GenMeta{ID: items[i].RID, PromptTokens: o.promptTokens, FinishReason: o.finishObj(0), CachedTokens: s.cachedOf(o)}}
				if err := wire.WriteEvent(w, ev); err != nil {
					return err
				}
			}
		}
		_, err := w.WriteString("data: [DONE]\n\n")
		if err == nil {
			err = w.Flush()
		}
		return err
	})
}

// cachedOf is meta_info.cached_tokens of o, or nil when the engine reports none.
func (s *Server) cachedOf(o *outcome) *int {
	if s.cfg.NoCachedTokens {
		return nil
	}
	n := o.cached
	return &n
}

func (s *Server) genFinal(rid string, o *outcome) wire.GenReply {
	n := len(o.gen.IDs)
	ids := o.gen.IDs
	if ids == nil {
		ids = []uint32{}
	}
	return wire.GenReply{Text: strings.Join(o.gen.Texts, ""), OutputIDs: ids,
		MetaInfo: wire.GenMeta{ID: rid, FinishReason: o.finishObj(n), PromptTokens: o.promptTokens, CompletionTokens: n, CachedTokens: s.cachedOf(o)}}
}

// headerSalt applies an X-Cache-Salt header to every item (it overrides the body's salt, as
// vllm#57609 does) when the server honours it; otherwise the header is ignored.
func (s *Server) headerSalt(ctx *fasthttp.RequestCtx, items []*wire.Item) {
	h := ctx.Request.Header.Peek(HeaderCacheSalt)
	if !s.cfg.SaltHeader || len(h) == 0 {
		return
	}
	s.noteSalts([]string{string(h)})
	for _, it := range items {
		it.Salt = string(h)
	}
}

// runAll runs the items in order under one abortable context. The returned
// done releases every page still held and forgets the rids; call it once
// the reply is finished.
func (s *Server) runAll(items []*wire.Item) ([]*outcome, context.Context, func()) {
	rctx, cancel := context.WithCancel(context.Background())
	for _, it := range items {
		s.register(it.RID, cancel)
	}
	outs := make([]*outcome, len(items))
	for i, it := range items {
		outs[i] = s.run(rctx, it)
		if outs[i].failed() {
			outs = outs[:i+1]
			break
		}
	}
	done := func() {
		s.mu.Lock()
		for _, o := range outs {
			s.leaveSlot(o)
		}
		s.mu.Unlock()
		for _, o := range outs {
			if o.pages != nil {
				s.releasePages(o.pages)
				o.pages = nil
			}
		}
		for _, it := range items {
			s.unregister(it.RID)
		}
		cancel()
	}
	return outs, rctx, done
}

func firstFailure(outs []*outcome) *outcome {
	for _, o := range outs {
		if o.failed() {
			return o
		}
	}
	return nil
}

// pace makes a non-streamed reply take as long as its tokens would.
func (s *Server) pace(ctx context.Context, outs []*outcome) {
	if s.cfg.TokenDelay <= 0 {
		return
	}
	n := 0
	for _, o := range outs {
		n += len(o.gen.IDs)
	}
	if !sleepCtx(ctx, time.Duration(n)*s.cfg.TokenDelay) {
		for _, o := range outs {
			o.finish, o.msg = "abort", "Abort request"
		}
	}
}

func (s *Server) setTruthHeaders(ctx *fasthttp.RequestCtx, outs []*outcome) {
	var foreign, quoted []*kvmodel.Writer
	seen := map[*kvmodel.Writer]bool{}
	seenQ := map[*kvmodel.Writer]bool{}
	for _, o := range outs {
		for _, w := range o.gen.Foreign {
			if !seen[w] {
				seen[w] = true
				foreign = append(foreign, w)
			}
		}
		for _, w := range o.gen.Quoted {
			if !seenQ[w] {
				seenQ[w] = true
				quoted = append(quoted, w)
			}
		}
	}
	if len(foreign) > 0 {
		s.countForeign()
	}
	ctx.Response.Header.Set(HeaderForeign, kvmodel.JoinRIDs(foreign))
	ctx.Response.Header.Set(HeaderQuoted, kvmodel.JoinRIDs(quoted))
}

// ---- OpenAI routes ----

func (s *Server) handleOpenAI(ctx *fasthttp.RequestCtx, r wire.Route) {
	s.countRequest(r.Path())
	req, items, promptOf, err := wire.ParseOpenAI(s.env, r, ctx.PostBody())
	if err != nil {
		s.reject("bad_request")
		writeOpenAIError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return
	}
	s.headerSalt(ctx, items)
	outs, rctx, done := s.runAll(items)
	if f := firstFailure(outs); f != nil {
		done()
		writeOpenAIError(ctx, f)
		return
	}
	s.setTruthHeaders(ctx, outs)
	model := req.Model
	if model == "" {
		model = s.cfg.Model
	}
	object, chunkObject := "text_completion", "text_completion"
	if r == wire.RouteChat {
		object, chunkObject = "chat.completion", "chat.completion.chunk"
	}
	id := items[0].RID
	created := time.Now().Unix()
	u := wire.Usage{}
	countedPrompt := map[int]bool{}
	for i, o := range outs {
		if !countedPrompt[promptOf[i]] {
			countedPrompt[promptOf[i]] = true
			u.PromptTokens += o.promptTokens
		}
		u.CompletionTokens += len(o.gen.IDs)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if !s.cfg.NoCachedTokens {
		// cached_tokens is counted once per prompt, as prompt_tokens is.
		u.PromptTokensDetails = &wire.PromptDetails{}
		seen := map[int]bool{}
		for i, o := range outs {
			if !seen[promptOf[i]] {
				seen[promptOf[i]] = true
				u.PromptTokensDetails.CachedTokens += o.cached
			}
		}
	}
	finishOf := func(o *outcome) *string {
		if o.finish == "abort" {
			return wire.Strp("abort")
		}
		return wire.Strp(o.finish)
	}
	if !req.Stream {
		s.pace(rctx, outs)
		done()
		resp := wire.Completion{ID: id, Object: object, Created: created, Model: model, Usage: &u}
		for i, o := range outs {
			text := strings.Join(o.gen.Texts, "")
			c := wire.Choice{Index: i, FinishReason: finishOf(o)}
			if r == wire.RouteChat {
				c.Message = &wire.ChatMessageOut{Role: "assistant", Content: text}
			} else {
				c.Text = &text
			}
			resp.Choices = append(resp.Choices, c)
		}
		body, _ := wire.Marshal(resp)
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	delay := s.cfg.TokenDelay
	wire.WriteStream(ctx, func(w *bufio.Writer) error {
		defer done()
		chunk := func(c wire.Choice) error {
			return wire.WriteEvent(w, wire.Completion{ID: id, Object: chunkObject, Created: created, Model: model, Choices: []wire.Choice{c}})
		}
		for i, o := range outs {
			if r == wire.RouteChat {
				if err := chunk(wire.Choice{Index: i, Delta: &wire.Delta{Role: "assistant", Content: wire.Strp("")}}); err != nil {
					return err
				}
			}
			for k, t := range o.gen.Texts {
				if !sleepCtx(rctx, delay) {
					o.finish = "abort"
					break
				}
				_ = k
				c := wire.Choice{Index: i}
				if r == wire.RouteChat {
					c.Delta = &wire.Delta{Content: wire.Strp(t)}
				} else {
					c.Text = wire.Strp(t)
				}
				if err := chunk(c); err != nil {
					return err
				}
			}
			c := wire.Choice{Index: i, FinishReason: finishOf(o)}
			if r == wire.RouteChat {
				c.Delta = &wire.Delta{}
			} else {
				c.Text = wire.Strp("")
			}
			if err := chunk(c); err != nil {
				return err
			}
		}
		if includeUsage {
			if err := wire.WriteEvent(w, wire.Completion{ID: id, Object: chunkObject, Created: created, Model: model, Choices: []wire.Choice{}, Usage: &u}); err != nil {
				return err
			}
		}
		w.WriteString("data: [DONE]\n\n")
		return w.Flush()
	})
}

// ---- /tokenize, /abort_request ----

func (s *Server) handleTokenize(ctx *fasthttp.RequestCtx) {
	s.statsMu.Lock()
	s.tokReqs++
	s.statsMu.Unlock()
	var req struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeOpenAIError(ctx, errOutcome(400, "invalid JSON body: "+err.Error()))
		return
	}
	prompts, batch, err := wire.Strings(req.Prompt, "prompt")
	if err != nil || prompts == nil {
		writeOpenAIError(ctx, errOutcome(400, "prompt: want a string or a list of strings"))
		return
	}
	type one struct {
		Tokens      []uint32 `json:"tokens"`
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
	}
	var body []byte
	if !batch {
		ids, texts := s.tok.Encode(prompts[0])
		s.rememberPieces(ids, texts)
		if ids == nil {
			ids = []uint32{}
		}
		body, _ = wire.Marshal(one{Tokens: ids, Count: len(ids), MaxModelLen: s.cfg.ContextLength})
	} else {
		all := make([][]uint32, len(prompts))
		counts := make([]int, len(prompts))
		for i, p := range prompts {
			var texts []string
			all[i], texts = s.tok.Encode(p)
			s.rememberPieces(all[i], texts)
			if all[i] == nil {
				all[i] = []uint32{}
			}
			counts[i] = len(all[i])
		}
		body, _ = wire.Marshal(map[string]any{"tokens": all, "count": counts, "max_model_len": s.cfg.ContextLength})
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

func (s *Server) handleAbort(ctx *fasthttp.RequestCtx) {
	var req struct {
		RID      string `json:"rid"`
		AbortAll bool   `json:"abort_all"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeOpenAIError(ctx, errOutcome(400, "invalid JSON body: "+err.Error()))
		return
	}
	s.activeMu.Lock()
	var cancels []context.CancelFunc
	for rid, c := range s.active {
		if req.AbortAll || rid == req.RID {
			cancels = append(cancels, c)
		}
	}
	s.activeMu.Unlock()
	for _, c := range cancels {
		c()
	}
	if s.cfg.Mode == ModePrefill && req.RID != "" {
		s.rooms.AbortRID(req.RID)
	}
	s.logf("abort_request rid=%q abort_all=%v: %d running request(s) aborted", req.RID, req.AbortAll, len(cancels))
	ctx.SetStatusCode(200)
}
