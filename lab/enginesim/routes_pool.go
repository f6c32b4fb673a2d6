package enginesim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Prefill-only routes (embeddings, rerank, score, classify, /encode): each
// input is one prompt, admitted like a generation prompt (context and pool
// checks, no output reservation), written into the pool for its forward
// pass and released. Nothing is generated, so nothing can leak through
// them; they run the same way in every mode (SGLang has no PD for them).

// embedDims is the length of the simulator's deterministic vectors.
const embedDims = 8

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
	if reason, msg := s.checkLengths(p, 0, false); reason != "" {
		s.reject(reason)
		return errOutcome(400, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pageWait)
	defer cancel()
	pages, err := s.allocPages(ctx, s.pagesFor(p))
	if err != nil {
		s.reject("no_pages")
		return errOutcome(503, err.Error())
	}
	self := &Writer{RID: s.newRID()}
	s.mu.Lock()
	v := &seqView{pool: s.pool, pages: pages, self: self}
	for i := 0; i < p; i++ {
		v.write(i, in.ids[i], in.texts[i])
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

// vector is a deterministic unit vector of n floats from the prompt's ids.
func vector(ids []uint32, n int) []float64 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:], id)
		h.Write(b[:])
	}
	x := h.Sum64()
	out := make([]float64, n)
	norm := 0.0
	for i := range out {
		// splitmix64 steps spread one hash over n values.
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		out[i] = float64(z>>11)/float64(1<<53)*2 - 1
		norm += out[i] * out[i]
	}
	norm = math.Sqrt(norm)
	for i := range out {
		out[i] = math.Round(out[i]/norm*1e6) / 1e6
	}
	return out
}

// unitScore maps a prompt to a score in (0, 1).
func unitScore(ids []uint32) float64 { return math.Round((vector(ids, 1)[0]+1)/2*1e6) / 1e6 }

func softmax(v []float64) []float64 {
	out := make([]float64, len(v))
	m, sum := math.Inf(-1), 0.0
	for _, x := range v {
		m = max(m, x)
	}
	for i, x := range v {
		out[i] = math.Exp(x - m)
		sum += out[i]
	}
	for i := range out {
		out[i] = math.Round(out[i]/sum*1e6) / 1e6
	}
	return out
}

// inputsOf decodes SGLang's embedding input union: a string, a list of
// strings, a list of token ids or a list of id lists.
func (s *Server) inputsOf(raw json.RawMessage, field string) ([]poolInput, bool, error) {
	if isNull(raw) {
		return nil, false, badf("%s is required", field)
	}
	if texts, batch, err := strings1(raw, field); err == nil {
		ins := make([]poolInput, len(texts))
		for i, t := range texts {
			ins[i] = s.textInput(t)
		}
		return ins, batch, nil
	}
	lists, batch, err := idLists(raw, field)
	if err != nil {
		return nil, false, badf("%s: want a string, a list of strings, a list of token ids or a list of lists", field)
	}
	ins := make([]poolInput, len(lists))
	for i, l := range lists {
		ins[i] = s.idInput(l)
	}
	return ins, batch, nil
}

// poolReq holds the fields the prefill-only routes share.
type poolReq struct {
	Model     string          `json:"model"`
	Input     json.RawMessage `json:"input"`
	Text      json.RawMessage `json:"text"`
	InputIDs  json.RawMessage `json:"input_ids"`
	Query     json.RawMessage `json:"query"`
	Documents []string        `json:"documents"`
	Items     json.RawMessage `json:"items"`
	TopN      *int            `json:"top_n"`
	// ReturnDocuments defaults to true, as in SGLang.
	ReturnDocuments *bool           `json:"return_documents"`
	LabelTokenIDs   []uint32        `json:"label_token_ids"`
	ApplySoftmax    bool            `json:"apply_softmax"`
	ItemFirst       bool            `json:"item_first"`
	CacheSalt       json.RawMessage `json:"cache_salt"`
}

func (s *Server) parsePool(ctx *fasthttp.RequestCtx, path string, fail func(*outcome)) (*poolReq, bool) {
	s.countRequest(path)
	var req poolReq
	err := json.Unmarshal(ctx.PostBody(), &req)
	if err == nil {
		err = s.noteSalt(req.CacheSalt)
	} else {
		err = badf("invalid JSON body: %v", err)
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
func (s *Server) runInputs(ctx *fasthttp.RequestCtx, path string) (*poolReq, []poolInput, []*outcome, bool) {
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
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": vector(in.ids, embedDims)}
	}
	writeJSON(ctx, map[string]any{"object": "list", "data": data, "model": req.Model, "usage": poolUsage(outs)})
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
		s.poolBad(fail, badf("Query cannot be empty"))
		return
	}
	if len(req.Documents) == 0 {
		s.poolBad(fail, badf("Documents cannot be empty"))
		return
	}
	if req.TopN != nil && *req.TopN < 1 {
		s.poolBad(fail, badf("Value error, parameter top_n should be larger than 0."))
		return
	}
	q := s.textInput(query)
	ins := make([]poolInput, len(req.Documents))
	for i, d := range req.Documents {
		if strings.TrimSpace(d) == "" {
			s.poolBad(fail, badf("Each document cannot be empty or whitespace only"))
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
		res[i] = ranked{Score: unitScore(in.ids), Index: i,
			MetaInfo: map[string]any{"id": fmt.Sprintf("rerank-%d", i), "prompt_tokens": outs[i].promptTokens}}
		if req.ReturnDocuments == nil || *req.ReturnDocuments {
			res[i].Document = &req.Documents[i]
		}
	}
	sort.SliceStable(res, func(a, b int) bool { return res[a].Score > res[b].Score })
	if req.TopN != nil && *req.TopN < len(res) {
		res = res[:*req.TopN]
	}
	writeJSON(ctx, res)
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
		s.poolBad(fail, badf("query: want a string or a list of token ids"))
		return
	}
	items, _, err := s.inputsOf(req.Items, "items")
	if err != nil {
		s.poolBad(fail, err)
		return
	}
	if len(items) == 0 {
		s.poolBad(fail, badf("items cannot be empty"))
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
			v[k] = unitScore(append(append([]uint32(nil), in.ids...), uint32(k)))
		}
		if req.ApplySoftmax {
			v = softmax(v)
		}
		scores[i] = v
	}
	writeJSON(ctx, map[string]any{"scores": scores, "model": req.Model, "usage": poolUsage(outs), "object": "scoring"})
}

// classifyLabels is the simulated classifier's id2label.
var classifyLabels = []string{"LABEL_0", "LABEL_1"}

func (s *Server) handleV1Classify(ctx *fasthttp.RequestCtx) {
	req, ins, outs, ok := s.runInputs(ctx, "/v1/classify")
	if !ok {
		return
	}
	data := make([]map[string]any, len(ins))
	for i, in := range ins {
		probs := softmax(vector(in.ids, len(classifyLabels)))
		best := 0
		for k := range probs {
			if probs[k] > probs[best] {
				best = k
			}
		}
		data[i] = map[string]any{"index": i, "label": classifyLabels[best], "probs": probs, "num_classes": len(probs)}
	}
	writeJSON(ctx, map[string]any{"id": "classify-" + s.newRID(), "object": "list", "created": time.Now().Unix(),
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
	case !isNull(req.Text) && isNull(req.InputIDs):
		ins, batch, err = s.inputsOf(req.Text, "text")
	case isNull(req.Text) && !isNull(req.InputIDs):
		var lists [][]uint32
		lists, batch, err = idLists(req.InputIDs, "input_ids")
		for _, l := range lists {
			ins = append(ins, s.idInput(l))
		}
	default:
		err = badf("exactly one of text and input_ids is required")
	}
	if err == nil && len(ins) == 0 {
		err = badf("empty batch")
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
	dims := embedDims
	if path == "/classify" {
		dims = len(classifyLabels)
	}
	replies := make([]map[string]any, len(ins))
	for i, in := range ins {
		replies[i] = map[string]any{"embedding": vector(in.ids, dims), "meta_info": map[string]any{
			"id": s.newRID(), "prompt_tokens": outs[i].promptTokens, "finish_reason": map[string]any{"type": "length", "length": 0}}}
	}
	if batch {
		writeJSON(ctx, replies)
		return
	}
	writeJSON(ctx, replies[0])
}
