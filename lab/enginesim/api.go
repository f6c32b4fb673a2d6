package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

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
)

// defaultOpenAIMaxTokens is how many tokens the OpenAI routes generate when
// the body asks for no limit; like SGLang, such a request takes no part in
// the prompt+output check.
const defaultOpenAIMaxTokens = 16

// defaultGenerateMaxNew is SGLang's sampling_params.max_new_tokens default.
const defaultGenerateMaxNew = 128

type route int

const (
	routeGenerate route = iota
	routeCompletions
	routeChat
)

func (r route) path() string {
	switch r {
	case routeCompletions:
		return "/v1/completions"
	case routeChat:
		return "/v1/chat/completions"
	}
	return "/generate"
}

var errBadRequest = errors.New("bad request")

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// ---- polymorphic JSON fields ----

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

func isArray(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '['
}

// strings1 decodes a string or a list of strings.
func strings1(raw json.RawMessage, field string) ([]string, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	if isArray(raw) {
		var v []string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, true, badf("%s: want a string or a list of strings", field)
		}
		return v, true, nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false, badf("%s: want a string or a list of strings", field)
	}
	return []string{v}, false, nil
}

// idLists decodes a list of ids or a list of lists.
func idLists(raw json.RawMessage, field string) ([][]uint32, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var one []uint32
	if err := json.Unmarshal(raw, &one); err == nil {
		return [][]uint32{one}, false, nil
	}
	var many [][]uint32
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, false, badf("%s: want a list of token ids or a list of lists", field)
	}
	return many, true, nil
}

// bootFields decodes bootstrap_host/port/room, single or batched, for n items.
func bootFields(host, port, roomRaw json.RawMessage, n int) ([]bootInfo, error) {
	out := make([]bootInfo, n)
	if isNull(roomRaw) && isNull(host) {
		return out, nil
	}
	hosts, _, err := strings1(host, "bootstrap_host")
	if err != nil {
		return nil, err
	}
	var rooms []uint64
	if isArray(roomRaw) {
		if err := json.Unmarshal(roomRaw, &rooms); err != nil {
			return nil, badf("bootstrap_room: want integers in [0, 2^63-1]")
		}
	} else if !isNull(roomRaw) {
		var r uint64
		if err := json.Unmarshal(roomRaw, &r); err != nil {
			return nil, badf("bootstrap_room: want an integer in [0, 2^63-1]")
		}
		rooms = []uint64{r}
	}
	var ports []int
	if isArray(port) {
		var ps []*int
		if err := json.Unmarshal(port, &ps); err != nil {
			return nil, badf("bootstrap_port: want an integer or null")
		}
		for _, p := range ps {
			if p == nil {
				ports = append(ports, 0)
			} else {
				ports = append(ports, *p)
			}
		}
	} else if !isNull(port) {
		var p int
		if err := json.Unmarshal(port, &p); err != nil {
			return nil, badf("bootstrap_port: want an integer or null")
		}
		ports = []int{p}
	}
	pick := func(i, l int) int {
		if l == 1 {
			return 0
		}
		return i
	}
	if len(rooms) == 0 {
		return nil, badf("bootstrap_room is required with bootstrap_host")
	}
	for _, l := range []int{len(hosts), len(rooms), len(ports)} {
		if l > 1 && l != n {
			return nil, badf("bootstrap fields: batched lists must have one entry per prompt (%d)", n)
		}
	}
	for i := range out {
		out[i].has = true
		out[i].room = rooms[pick(i, len(rooms))]
		if len(hosts) > 0 {
			out[i].host = hosts[pick(i, len(hosts))]
		} else {
			out[i].host = "127.0.0.1"
		}
		if len(ports) > 0 {
			out[i].port = ports[pick(i, len(ports))]
		}
		if out[i].port < 0 || out[i].port > 65535 {
			return nil, badf("bootstrap_port: %d is not a port", out[i].port)
		}
	}
	return out, nil
}

// ---- /generate ----

type samplingParams struct {
	MaxNewTokens *int `json:"max_new_tokens"`
}

type generateReq struct {
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	Stream         bool            `json:"stream"`
	RID            json.RawMessage `json:"rid"`
	BootstrapHost  json.RawMessage `json:"bootstrap_host"`
	BootstrapPort  json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom  json.RawMessage `json:"bootstrap_room"`
	CacheSalt      json.RawMessage `json:"cache_salt"`
	// ExtraKey is the native route's name for the prefix-cache salt.
	ExtraKey json.RawMessage `json:"extra_key"`
}

func (s *Server) parseGenerate(body []byte) ([]*item, bool, bool, error) {
	var req generateReq
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, false, false, badf("invalid JSON body: %v", err)
	}
	if err := s.noteSalt(req.CacheSalt); err != nil {
		return nil, false, false, err
	}
	if err := s.noteSaltAs(req.ExtraKey, "extra_key"); err != nil {
		return nil, false, false, err
	}
	texts, batchT, err := strings1(req.Text, "text")
	if err != nil {
		return nil, false, false, err
	}
	ids, batchI, err := idLists(req.InputIDs, "input_ids")
	if err != nil {
		return nil, false, false, err
	}
	if (texts == nil) == (ids == nil) {
		return nil, false, false, badf("exactly one of text and input_ids is required")
	}
	n := len(texts) + len(ids)
	batch := batchT || batchI
	if n == 0 {
		return nil, false, false, badf("empty batch")
	}
	var sps []samplingParams
	if isArray(req.SamplingParams) {
		if err := json.Unmarshal(req.SamplingParams, &sps); err != nil || len(sps) != n {
			return nil, false, false, badf("sampling_params: a list must have one object per prompt")
		}
	} else if !isNull(req.SamplingParams) {
		var sp samplingParams
		if err := json.Unmarshal(req.SamplingParams, &sp); err != nil {
			return nil, false, false, badf("sampling_params: %v", err)
		}
		sps = []samplingParams{sp}
	}
	rids, _, err := strings1(req.RID, "rid")
	if err != nil {
		return nil, false, false, err
	}
	if len(rids) > 1 && len(rids) != n {
		return nil, false, false, badf("rid: a list must have one id per prompt")
	}
	boots, err := bootFields(req.BootstrapHost, req.BootstrapPort, req.BootstrapRoom, n)
	if err != nil {
		return nil, false, false, err
	}
	items := make([]*item, n)
	for i := range items {
		it := &item{maxNew: defaultGenerateMaxNew, maxNewGiven: true, boot: boots[i]}
		if texts != nil {
			it.prompt = texts[i]
		} else {
			it.ids = ids[i]
		}
		if len(sps) > 0 {
			sp := sps[0]
			if len(sps) > 1 {
				sp = sps[i]
			}
			if sp.MaxNewTokens != nil {
				if *sp.MaxNewTokens < 0 {
					return nil, false, false, badf("sampling_params.max_new_tokens must not be negative")
				}
				it.maxNew = *sp.MaxNewTokens
			}
		}
		switch {
		case len(rids) == 1 && !batch:
			it.rid = rids[0]
		case len(rids) > 1:
			it.rid = rids[i]
		}
		if it.rid == "" {
			it.rid = s.newRID()
		}
		items[i] = it
	}
	return items, batch, req.Stream, nil
}

type finishObj struct {
	Type    string `json:"type"`
	Length  int    `json:"length,omitempty"`
	Matched *int   `json:"matched,omitempty"`
	Message string `json:"message,omitempty"`
}

type genMeta struct {
	ID               string     `json:"id"`
	FinishReason     *finishObj `json:"finish_reason"`
	PromptTokens     int        `json:"prompt_tokens"`
	CompletionTokens int        `json:"completion_tokens"`
	CachedTokens     int        `json:"cached_tokens"`
}

type genReply struct {
	Text      string   `json:"text"`
	OutputIDs []uint32 `json:"output_ids"`
	MetaInfo  genMeta  `json:"meta_info"`
	Index     *int     `json:"index,omitempty"`
}

func (o *outcome) finishObj(n int) *finishObj {
	switch o.finish {
	case "abort":
		return &finishObj{Type: "abort", Message: o.msg}
	case "stop":
		return &finishObj{Type: "stop"}
	}
	return &finishObj{Type: "length", Length: n}
}

func (s *Server) handleGenerate(ctx *fasthttp.RequestCtx) {
	s.countRequest("/generate")
	items, batch, stream, err := s.parseGenerate(ctx.PostBody())
	if err != nil {
		s.reject("bad_request")
		writeGenerateError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return
	}
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
			replies := make([]genReply, len(outs))
			for i, o := range outs {
				replies[i] = genFinal(items[i].rid, o)
			}
			body, _ = marshal(replies)
		} else {
			body, _ = marshal(genFinal(items[0].rid, outs[0]))
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		return
	}
	delay := s.cfg.TokenDelay
	writeStream(ctx, func(w *bufio.Writer) error {
		defer done()
		for i, o := range outs {
			var idx *int
			if batch {
				idx = &i
			}
			var cum strings.Builder
			n := len(o.gen.ids)
			for k := 0; k < n; k++ {
				if !sleepCtx(rctx, delay) {
					o.finish, o.msg = "abort", "Abort request"
					break
				}
				cum.WriteString(o.gen.texts[k])
				ev := genReply{Text: cum.String(), OutputIDs: o.gen.ids[:k+1], Index: idx,
					MetaInfo: genMeta{ID: items[i].rid, PromptTokens: o.promptTokens, CompletionTokens: k + 1}}
				if k == n-1 {
					ev.MetaInfo.FinishReason = o.finishObj(n)
				}
				if err := writeEvent(w, ev); err != nil {
					return err
				}
			}
			if n == 0 || o.finish == "abort" {
				ev := genReply{Text: cum.String(), OutputIDs: o.gen.ids[:min(n, len(o.gen.ids))], Index: idx,
					MetaInfo: genMeta{ID: items[i].rid, PromptTokens: o.promptTokens, FinishReason: o.finishObj(0)}}
				if err := writeEvent(w, ev); err != nil {
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

func genFinal(rid string, o *outcome) genReply {
	n := len(o.gen.ids)
	ids := o.gen.ids
	if ids == nil {
		ids = []uint32{}
	}
	return genReply{Text: strings.Join(o.gen.texts, ""), OutputIDs: ids,
		MetaInfo: genMeta{ID: rid, FinishReason: o.finishObj(n), PromptTokens: o.promptTokens, CompletionTokens: n}}
}

func writeEvent(w *bufio.Writer, v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	w.WriteString("data: ")
	w.Write(b)
	w.WriteString("\n\n")
	return w.Flush()
}

func writeGenerateError(ctx *fasthttp.RequestCtx, o *outcome) {
	b, _ := marshal(map[string]any{"error": map[string]any{"message": o.msg}})
	ctx.SetStatusCode(o.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

type openAIError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func writeOpenAIError(ctx *fasthttp.RequestCtx, o *outcome) {
	b, _ := marshal(openAIError{Object: "error", Message: o.msg, Type: o.errType, Code: o.status})
	ctx.SetStatusCode(o.status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// runAll runs the items in order under one abortable context. The returned
// done releases every page still held and forgets the rids; call it once
// the reply is finished.
func (s *Server) runAll(items []*item) ([]*outcome, context.Context, func()) {
	rctx, cancel := context.WithCancel(context.Background())
	for _, it := range items {
		s.register(it.rid, cancel)
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
		for _, o := range outs {
			if o.pages != nil {
				s.releasePages(o.pages)
				o.pages = nil
			}
		}
		for _, it := range items {
			s.unregister(it.rid)
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
		n += len(o.gen.ids)
	}
	if !sleepCtx(ctx, time.Duration(n)*s.cfg.TokenDelay) {
		for _, o := range outs {
			o.finish, o.msg = "abort", "Abort request"
		}
	}
}

func (s *Server) setTruthHeaders(ctx *fasthttp.RequestCtx, outs []*outcome) {
	var foreign, quoted []*Writer
	seen := map[*Writer]bool{}
	seenQ := map[*Writer]bool{}
	for _, o := range outs {
		for _, w := range o.gen.foreign {
			if !seen[w] {
				seen[w] = true
				foreign = append(foreign, w)
			}
		}
		for _, w := range o.gen.quoted {
			if !seenQ[w] {
				seenQ[w] = true
				quoted = append(quoted, w)
			}
		}
	}
	if len(foreign) > 0 {
		s.countForeign()
	}
	ctx.Response.Header.Set(HeaderForeign, joinRIDs(foreign))
	ctx.Response.Header.Set(HeaderQuoted, joinRIDs(quoted))
}

// ---- OpenAI routes ----

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type openAIReq struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	User          string          `json:"user"`
	RID           json.RawMessage `json:"rid"`
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
	CacheSalt     json.RawMessage `json:"cache_salt"`
}

// RenderChatML renders messages as the simulator counts them: each message
// "<|im_start|>{role}\n{content}<|im_end|>\n", then "<|im_start|>assistant\n".
func RenderChatML(roles, contents []string) string {
	var b strings.Builder
	for i := range roles {
		b.WriteString("<|im_start|>")
		b.WriteString(roles[i])
		b.WriteByte('\n')
		b.WriteString(contents[i])
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

func messageText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	if !isArray(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badf("messages[].content: want a string or a list of parts")
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badf("messages[].content: want a string or a list of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", badf("messages[].content: only text parts are supported, got %q", p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

func (s *Server) parseOpenAI(r route, body []byte) (*openAIReq, []*item, []int, error) {
	var req openAIReq
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, nil, badf("invalid JSON body: %v", err)
	}
	if err := s.noteSalt(req.CacheSalt); err != nil {
		return nil, nil, nil, err
	}
	var prompts []string
	var idPrompts [][]uint32
	if r == routeChat {
		if len(req.Messages) == 0 {
			return nil, nil, nil, badf("messages: at least one message is required")
		}
		roles := make([]string, len(req.Messages))
		contents := make([]string, len(req.Messages))
		for i, m := range req.Messages {
			if m.Role == "" {
				return nil, nil, nil, badf("messages[%d].role is required", i)
			}
			t, err := messageText(m.Content)
			if err != nil {
				return nil, nil, nil, err
			}
			roles[i], contents[i] = m.Role, t
		}
		prompts = []string{RenderChatML(roles, contents)}
	} else {
		ps, _, err := strings1(req.Prompt, "prompt")
		if err != nil {
			ids, _, err2 := idLists(req.Prompt, "prompt")
			if err2 != nil {
				return nil, nil, nil, err
			}
			idPrompts = ids
		} else {
			prompts = ps
		}
		if len(prompts)+len(idPrompts) == 0 {
			return nil, nil, nil, badf("prompt is required")
		}
	}
	maxNew, given := defaultOpenAIMaxTokens, false
	if req.MaxCompletionTokens != nil {
		maxNew, given = *req.MaxCompletionTokens, true
	} else if req.MaxTokens != nil {
		maxNew, given = *req.MaxTokens, true
	}
	if maxNew < 0 {
		return nil, nil, nil, badf("max_tokens must not be negative")
	}
	n := 1
	if req.N != nil {
		n = *req.N
	}
	if n < 1 || n > 128 {
		return nil, nil, nil, badf("n must be between 1 and 128")
	}
	nPrompts := len(prompts) + len(idPrompts)
	rids, _, err := strings1(req.RID, "rid")
	if err != nil {
		return nil, nil, nil, err
	}
	base := ""
	if len(rids) > 0 {
		base = rids[0]
	}
	if base == "" {
		base = s.newRID()
	}
	boots, err := bootFields(req.BootstrapHost, req.BootstrapPort, req.BootstrapRoom, nPrompts)
	if err != nil {
		return nil, nil, nil, err
	}
	var items []*item
	var promptOf []int
	for pi := 0; pi < nPrompts; pi++ {
		for c := 0; c < n; c++ {
			it := &item{maxNew: maxNew, maxNewGiven: given, boot: boots[pi], tenant: req.User}
			if prompts != nil {
				it.prompt = prompts[pi]
			} else {
				it.ids = idPrompts[pi]
			}
			it.rid = base
			if len(items) > 0 {
				it.rid = base + "-" + strconv.Itoa(len(items))
			}
			items = append(items, it)
			promptOf = append(promptOf, pi)
		}
	}
	return &req, items, promptOf, nil
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatMsgOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type choiceOut struct {
	Index        int         `json:"index"`
	Message      *chatMsgOut `json:"message,omitempty"`
	Text         *string     `json:"text,omitempty"`
	Delta        *deltaOut   `json:"delta,omitempty"`
	Logprobs     any         `json:"logprobs"`
	FinishReason *string     `json:"finish_reason"`
	MatchedStop  any         `json:"matched_stop"`
}

type deltaOut struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type completionOut struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []choiceOut `json:"choices"`
	Usage   *usage      `json:"usage,omitempty"`
}

func strp(s string) *string { return &s }

func (s *Server) handleOpenAI(ctx *fasthttp.RequestCtx, r route) {
	s.countRequest(r.path())
	req, items, promptOf, err := s.parseOpenAI(r, ctx.PostBody())
	if err != nil {
		s.reject("bad_request")
		writeOpenAIError(ctx, errOutcome(400, strings.TrimPrefix(err.Error(), "bad request: ")))
		return
	}
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
	if r == routeChat {
		object, chunkObject = "chat.completion", "chat.completion.chunk"
	}
	id := items[0].rid
	created := time.Now().Unix()
	u := usage{}
	countedPrompt := map[int]bool{}
	for i, o := range outs {
		if !countedPrompt[promptOf[i]] {
			countedPrompt[promptOf[i]] = true
			u.PromptTokens += o.promptTokens
		}
		u.CompletionTokens += len(o.gen.ids)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	finishOf := func(o *outcome) *string {
		if o.finish == "abort" {
			return strp("abort")
		}
		return strp(o.finish)
	}
	if !req.Stream {
		s.pace(rctx, outs)
		done()
		resp := completionOut{ID: id, Object: object, Created: created, Model: model, Usage: &u}
		for i, o := range outs {
			text := strings.Join(o.gen.texts, "")
			c := choiceOut{Index: i, FinishReason: finishOf(o)}
			if r == routeChat {
				c.Message = &chatMsgOut{Role: "assistant", Content: text}
			} else {
				c.Text = &text
			}
			resp.Choices = append(resp.Choices, c)
		}
		body, _ := marshal(resp)
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	delay := s.cfg.TokenDelay
	writeStream(ctx, func(w *bufio.Writer) error {
		defer done()
		chunk := func(c choiceOut) error {
			return writeEvent(w, completionOut{ID: id, Object: chunkObject, Created: created, Model: model, Choices: []choiceOut{c}})
		}
		for i, o := range outs {
			if r == routeChat {
				if err := chunk(choiceOut{Index: i, Delta: &deltaOut{Role: "assistant", Content: strp("")}}); err != nil {
					return err
				}
			}
			for k, t := range o.gen.texts {
				if !sleepCtx(rctx, delay) {
					o.finish = "abort"
					break
				}
				_ = k
				c := choiceOut{Index: i}
				if r == routeChat {
					c.Delta = &deltaOut{Content: strp(t)}
				} else {
					c.Text = strp(t)
				}
				if err := chunk(c); err != nil {
					return err
				}
			}
			c := choiceOut{Index: i, FinishReason: finishOf(o)}
			if r == routeChat {
				c.Delta = &deltaOut{}
			} else {
				c.Text = strp("")
			}
			if err := chunk(c); err != nil {
				return err
			}
		}
		if includeUsage {
			if err := writeEvent(w, completionOut{ID: id, Object: chunkObject, Created: created, Model: model, Choices: []choiceOut{}, Usage: &u}); err != nil {
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
	prompts, batch, err := strings1(req.Prompt, "prompt")
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
		body, _ = marshal(one{Tokens: ids, Count: len(ids), MaxModelLen: s.cfg.ContextLength})
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
		body, _ = marshal(map[string]any{"tokens": all, "count": counts, "max_model_len": s.cfg.ContextLength})
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
		s.rooms.abortRID(req.RID)
	}
	s.logf("abort_request rid=%q abort_all=%v: %d running request(s) aborted", req.RID, req.AbortAll, len(cancels))
	ctx.SetStatusCode(200)
}
