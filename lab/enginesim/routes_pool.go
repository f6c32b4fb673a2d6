package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

// Prefill-only routes (embeddings, rerank, score, classify, /encode): each
// input is one prompt, admitted like a generation prompt (context and pool
// checks, no output reservation), written into the pool for its forward
// pass and released. Nothing is generated, so nothing can leak through
// them; they run the same way in every mode (SGLang has no PD for them).

// poolInput is one prompt of a prefill-only request.
type poolInput struct {
	ids   []uint32
	texts []string
}

func (s *Server) textInput(t string) poolInput {
	ids, texts := s.tok.Encode(t)
	return poolInput{ids, texts}
}

func (s *Server) idInput(ids []uint32) poolInput { return poolInput{ids, s.idTexts(ids)} }

// concat joins two inputs into one prompt (a rerank or score pair). The
// tokenizer's slices are shared, so it copies.
func concat(a, b poolInput) poolInput {
	return poolInput{append(append([]uint32(nil), a.ids...), b.ids...), append(append([]string(nil), a.texts...), b.texts...)}
}

// prefillOnly admits one input and runs its forward pass over its pages.
func (s *Server) prefillOnly(in poolInput) *outcome {
	p := len(in.ids)
	s.countPrompt(p)
	if p == 0 {
		s.reject("empty")
		return errOutcome(400, "The input is empty: at least one token is required.")
	}
	if reason, msg, status := s.checkInput(p, 0, false); reason != "" {
		s.reject(reason)
		return errOutcome(status, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pageWait)
	defer cancel()
	pages, err := s.allocPages(ctx, s.pagesFor(p))
	if err != nil {
		s.reject("no_pages")
		return errOutcome(503, err.Error())
	}
	self := &kvmodel.Writer{RID: s.newRID()}
	s.mu.Lock()
	v := &kvmodel.SeqView{Pool: s.pool, Pages: pages, Self: self}
	for i := 0; i < p; i++ {
		v.Write(i, in.ids[i], in.texts[i])
	}
	s.mu.Unlock()
	s.releasePages(pages)
	return &outcome{status: 200, promptTokens: p}
}

// runPool runs every input in order and stops at the first failure.
func (s *Server) runPool(ins []poolInput) ([]*outcome, *outcome) {
	outs := make([]*outcome, 0, len(ins))
	for _, in := range ins {
		o := s.prefillOnly(in)
		if o.failed() {
			return nil, o
		}
		outs = append(outs, o)
	}
	return outs, nil
}

// inputsOf decodes SGLang's embedding input union: a string, a list of
// strings, a list of token ids or a list of id lists.
func (s *Server) inputsOf(raw json.RawMessage, field string) ([]poolInput, bool, error) {
	if wire.IsNull(raw) {
		return nil, false, wire.Badf("%s is required", field)
	}
	if texts, batch, err := wire.Strings(raw, field); err == nil {
		ins := make([]poolInput, len(texts))
		for i, t := range texts {
			ins[i] = s.textInput(t)
		}
		return ins, batch, nil
	}
	lists, batch, err := wire.IDLists(raw, field)
	if err != nil {
		return nil, false, wire.Badf("%s: want a string, a list of strings, a list of token ids or a list of lists", field)
	}
	ins := make([]poolInput, len(lists))
	for i, l := range lists {
		ins[i] = s.idInput(l)
	}
	return ins, batch, nil
}

func (s *Server) parsePool(ctx *fasthttp.RequestCtx, path string, fail func(*outcome)) (*wire.PoolReq, bool) {
	s.countRequest(path)
	var req wire.PoolReq
	err := json.Unmarshal(ctx.PostBody(), &req)
	if err == nil {
		_, err = s.env.NoteSalt(req.CacheSalt, "cache_salt")
	} else {
		err = wire.Badf("invalid JSON body: %v", err)
	}
	if err != nil {
		s.reject("bad_request")
		fail(errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return nil, false
	}
	if req.Model == "" {
		req.Model = s.cfg.Model
	}
	return &req, true
}

func (s *Server) poolBad(fail func(*outcome), err error) {
	s.reject("bad_request")
	fail(errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
}

func sumPrompt(outs []*outcome) int {
	n := 0
	for _, o := range outs {
		n += o.promptTokens
	}
	return n
}

func poolUsage(outs []*outcome) map[string]any {
	n := sumPrompt(outs)
	return map[string]any{"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}
}

// runInputs parses an OpenAI-shaped prefill-only request whose prompts are its "input", and runs
// them through the pool; false means the error reply was written.
func (s *Server) runInputs(ctx *fasthttp.RequestCtx, path string) (*wire.PoolReq, []poolInput, []*outcome, bool) {
	fail := func(o *outcome) { writeOpenAIError(ctx, o) }
	req, ok := s.parsePool(ctx, path, fail)
	if !ok {
		return nil, nil, nil, false
	}
	ins, _, err := s.inputsOf(req.Input, "input")
	if err != nil {
		s.poolBad(fail, err)
		return nil, nil, nil, false
	}
	outs, f := s.runPool(ins)
	if f != nil {
		fail(f)
		return nil, nil, nil, false
	}
	return req, ins, outs, true
}

func (s *Server) handleEmbeddings(ctx *fasthttp.RequestCtx) {
	req, ins, outs, ok := s.runInputs(ctx, "/v1/embeddings")
	if !ok {
		return
	}
	data := make([]map[string]any, len(ins))
	for i, in := range ins {
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": kvmodel.Vector(in.ids, kvmodel.EmbedDims)}
	}
	wire.WriteJSON(ctx, map[string]any{"object": "list", "data": data, "model": req.Model, "usage": poolUsage(outs)})
}

// handleRerank answers SGLang's /v1/rerank: a list sorted by score, each
// {"score","document","index","meta_info"}. Each query+document pair is
// one prompt: the query's tokens followed by the document's.
func (s *Server) handleRerank(ctx *fasthttp.RequestCtx) {
	fail := func(o *outcome) { writeOpenAIError(ctx, o) }
	req, ok := s.parsePool(ctx, "/v1/rerank", fail)
	if !ok {
		return
	}
	var query string
	if err := json.Unmarshal(req.Query, &query); err != nil || strings.TrimSpace(query) == "" {
		s.poolBad(fail, wire.Badf("Query cannot be empty"))
		return
	}
	if len(req.Documents) == 0 {
		s.poolBad(fail, wire.Badf("Documents cannot be empty"))
		return
	}
	if req.TopN != nil && *req.TopN < 1 {
		s.poolBad(fail, wire.Badf("Value error, parameter top_n should be larger than 0."))
		return
	}
	q := s.textInput(query)
	ins := make([]poolInput, len(req.Documents))
	for i, d := range req.Documents {
		if strings.TrimSpace(d) == "" {
			s.poolBad(fail, wire.Badf("Each document cannot be empty or whitespace only"))
			return
		}
		ins[i] = concat(q, s.textInput(d))
	}
	outs, f := s.runPool(ins)
	if f != nil {
		fail(f)
		return
	}
	type ranked struct {
		Score    float64        `json:"score"`
		Document *string        `json:"document,omitempty"`
		Index    int            `json:"index"`
		MetaInfo map[string]any `json:"meta_info"`
	}
	res := make([]ranked, len(ins))
	for i, in := range ins {
		res[i] = ranked{Score: kvmodel.UnitScore(in.ids), Index: i,
			MetaInfo: map[string]any{"id": fmt.Sprintf("rerank-%d", i), "prompt_tokens": outs[i].promptTokens}}
		if req.ReturnDocuments == nil || *req.ReturnDocuments {
			res[i].Document = &req.Documents[i]
		}
	}
	sort.SliceStable(res, func(a, b int) bool { return res[a].Score > res[b].Score })
	if req.TopN != nil && *req.TopN < len(res) {
		res = res[:*req.TopN]
	}
	wire.WriteJSON(ctx, res)
}

// handleScore answers SGLang's /v1/score: {"scores":[[p per label]…],
// "model","usage","object":"scoring"}. Each query+item pair is one prompt
// (item first when item_first).
func (s *Server) handleScore(ctx *fasthttp.RequestCtx) {
	fail := func(o *outcome) { writeOpenAIError(ctx, o) }
	req, ok := s.parsePool(ctx, "/v1/score", fail)
	if !ok {
		return
	}
	qs, _, err := s.inputsOf(req.Query, "query")
	if err != nil || len(qs) != 1 {
		s.poolBad(fail, wire.Badf("query: want a string or a list of token ids"))
		return
	}
	items, _, err := s.inputsOf(req.Items, "items")
	if err != nil {
		s.poolBad(fail, err)
		return
	}
	if len(items) == 0 {
		s.poolBad(fail, wire.Badf("items cannot be empty"))
		return
	}
	ins := make([]poolInput, len(items))
	for i, it := range items {
		if req.ItemFirst {
			ins[i] = concat(it, qs[0])
		} else {
			ins[i] = concat(qs[0], it)
		}
	}
	outs, f := s.runPool(ins)
	if f != nil {
		fail(f)
		return
	}
	labels := max(len(req.LabelTokenIDs), 1)
	scores := make([][]float64, len(ins))
	for i, in := range ins {
		v := make([]float64, labels)
		for k := range v {
			v[k] = kvmodel.UnitScore(append(append([]uint32(nil), in.ids...), uint32(k)))
		}
		if req.ApplySoftmax {
			v = kvmodel.Softmax(v)
		}
		scores[i] = v
	}
	wire.WriteJSON(ctx, map[string]any{"scores": scores, "model": req.Model, "usage": poolUsage(outs), "object": "scoring"})
}

func (s *Server) handleV1Classify(ctx *fasthttp.RequestCtx) {
	req, ins, outs, ok := s.runInputs(ctx, "/v1/classify")
	if !ok {
		return
	}
	data := make([]map[string]any, len(ins))
	for i, in := range ins {
		probs := kvmodel.Softmax(kvmodel.Vector(in.ids, len(kvmodel.ClassifyLabels)))
		best := 0
		for k := range probs {
			if probs[k] > probs[best] {
				best = k
			}
		}
		data[i] = map[string]any{"index": i, "label": kvmodel.ClassifyLabels[best], "probs": probs, "num_classes": len(probs)}
	}
	wire.WriteJSON(ctx, map[string]any{"id": "classify-" + s.newRID(), "object": "list", "created": time.Now().Unix(),
		"model": req.Model, "data": data, "usage": poolUsage(outs)})
}

// handleEncode answers native /encode and /classify ({"text"|"input_ids"},
// single or batched) with {"embedding":[…],"meta_info":{…}} per input;
// /classify's embedding is the classifier's logits.
func (s *Server) handleEncode(ctx *fasthttp.RequestCtx, path string) {
	fail := func(o *outcome) { writeGenerateError(ctx, o) }
	req, ok := s.parsePool(ctx, path, fail)
	if !ok {
		return
	}
	var ins []poolInput
	var batch bool
	var err error
	switch {
	case !wire.IsNull(req.Text) && wire.IsNull(req.InputIDs):
		ins, batch, err = s.inputsOf(req.Text, "text")
	case wire.IsNull(req.Text) && !wire.IsNull(req.InputIDs):
		var lists [][]uint32
		lists, batch, err = wire.IDLists(req.InputIDs, "input_ids")
		for _, l := range lists {
			ins = append(ins, s.idInput(l))
		}
	default:
		err = wire.Badf("exactly one of text and input_ids is required")
	}
	if err == nil && len(ins) == 0 {
		err = wire.Badf("empty batch")
	}
	if err != nil {
		s.poolBad(fail, err)
		return
	}
	outs, f := s.runPool(ins)
	if f != nil {
		fail(f)
		return
	}
	dims := kvmodel.EmbedDims
	if path == "/classify" {
		dims = len(kvmodel.ClassifyLabels)
	}
	replies := make([]map[string]any, len(ins))
	for i, in := range ins {
		replies[i] = map[string]any{"embedding": kvmodel.Vector(in.ids, dims), "meta_info": map[string]any{
			"id": s.newRID(), "prompt_tokens": outs[i].promptTokens, "finish_reason": map[string]any{"type": "length", "length": 0}}}
	}
	if batch {
		wire.WriteJSON(ctx, replies)
		return
	}
	wire.WriteJSON(ctx, replies[0])
}
