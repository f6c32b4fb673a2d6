package gateway

import (
	"errors"
	"fmt"
	"sort"
	"time"

	json "github.com/goccy/go-json"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
)

// The utility routes: tokenize, detokenize and Anthropic's count_tokens. They prefill nothing
// and generate nothing, so they need no admission; but they send the client's bytes to an
// engine, which tokenizes them, so they are under the tenant's limits like every other route:
// a request each against rpm, a slot against max_concurrent while the engine works, and their
// tokens against tpm (reserved by a bound, settled by the engine's count). They are passed to
// one healthy engine, their bodies allow-listed like every other route, their replies
// normalised like every other reply.

var utilityFields = map[string]map[string]bool{
	"/v1/tokenize":              request.AllowList("model", "prompt", "add_special_tokens"),
	"/tokenize":                 request.AllowList("model", "prompt", "add_special_tokens"),
	"/v1/detokenize":            request.AllowList("model", "tokens"),
	"/detokenize":               request.AllowList("model", "tokens"),
	"/v1/messages/count_tokens": request.AllowList("model", "messages", "system", "tools", "tool_choice", "thinking"),
}

// utilityTimeout bounds one utility call: they are quick on any engine.
const utilityTimeout = 10 * time.Second

// utility serves one utility call as an exchange of its own: ids, answers and the access line
// come from the same one way out (answer.go) as every other route's.
func (g *Gateway) utility(ctx *fasthttp.RequestCtx, path string) {
	x := &exchange{g: g, start: time.Now(), env: pathEnvelope(ctx.Path())}
	x.clientAddr, x.method = ctx.RemoteAddr(), methodName(ctx.Method())
	x.rid, _ = requestIDs(ctx)
	var model string
	counted := int64(-1) // the engine's count of the request's tokens, once known
	defer func() { x.utilityLine(path, model, counted) }()
	fail := func(e *apierr.Error) { x.answer(ctx, e) }
	t := g.authenticate(ctx)
	if t == nil {
		fail(apierr.Unauthorized)
		return
	}
	x.tenant = t
	body, e := readBody(ctx, g.cfg.MaxBodyBytes)
	if e != nil {
		fail(e)
		return
	}
	if e := request.CheckKeys(body); e != nil {
		fail(e) // an engine reads the first of duplicate or case-variant keys differently
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		fail(apierr.BadRequest("", "Request body must be a JSON object."))
		return
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	_ = json.Unmarshal(fields["model"], &model) // for the access log only; absent or not a string: ""
	sort.Strings(names)
	for _, k := range names {
		if !utilityFields[path][k] {
			fail(apierr.BadRequest(k, fmt.Sprintf("Unsupported field %q for %s.", k, path)))
			return
		}
	}
	served, e := g.modelTab().resolve(request.Chat, model, true) // before the limits: an unknown model costs nothing
	if e != nil {
		fail(e)
		return
	}
	// kvgate limits: refused past the tenant's limits before any engine sees the bytes.
	bound := utilityTokens(path, fields, len(body))
	if t.TPM > 0 {
		// The byte bound is loose (~4 bytes a token): capped so that it alone never refuses a
		// request as larger than the whole minute; settlement charges the engine's count.
		bound = min(bound, int64(t.TPM))
	}
	ticket, _, e := g.reserve(&ctx.Response.Header, t, bound)
	if e != nil {
		fail(e)
		return
	}
	var used int64 // what is charged: nothing unless the engine answered
	defer func() { g.settle(t, ticket, used) }()
	b := g.utilityBackend(served)
	if b == nil {
		fail(apierr.NoBackend())
		return
	}
	x.upstream = b.Name
	resp, err := b.Call(path, body, utilityTimeout)
	if err != nil {
		g.log.Warn("utility call failed", zap.String("request_id", x.rid), zap.String("backend", b.Name), zap.Error(err))
		fail(fromUpstream(err))
		return
	}
	// The reply is already read (bounded by backends' maxCallReply); what normalising it costs is
	// charged to upstream.max_buffered_bytes like any whole reply.
	c := g.replies.NewCharge()
	defer c.Done()
	var out []byte
	var v any
	if c.Reserve(config.ReplyCostFactor * int64(len(resp.Body))) {
		out, v, _, err = reply.Body(g.watch.Begin(x.rid, "", t, 0, nil).Guard(), resp.ContentType, resp.Body, c)
	} else {
		err = reply.ErrBudget
	}
	if errors.Is(err, reply.ErrBudget) {
		g.metrics.repliesOverBudget.Inc()
		fail(apierr.ReplyOverBudget())
		return
	}
	if err != nil {
		g.log.Warn("utility reply refused", zap.String("request_id", x.rid), zap.String("backend", b.Name), zap.Error(err))
		fail(apierr.UpstreamFailed("The engine's reply could not be used."))
		return
	}
	if resp.Status >= 200 && resp.Status <= 299 {
		used = bound
		if n, ok := utilityCount(path, fields, v); ok {
			used, counted = n, n
		}
	}
	x.replied(ctx, resp.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
}

// utilityBackend is a usable engine, the least loaded (any role: they share the tokenizer).
func (g *Gateway) utilityBackend(model string) *backends.Backend {
	routes, err := g.routesFor(model)
	if err != nil {
		return nil
	}
	var pick *backends.Backend
	var pickLoad int64
	for i := range routes {
		r := &routes[i]
		b := r.Unified
		if b == nil {
			b = r.Prefill
		}
		if l := r.Load(); pick == nil || l < pickLoad {
			pick, pickLoad = b, l
		}
	}
	return pick
}

// utilityTokens is what a utility request reserves against tpm: the token ids it sends
// (detokenize), else its body's length in bytes, a sound bound on the tokens of any text in it
// (no tokenizer emits more than one token per byte; JSON syntax and escapes only add bytes).
func utilityTokens(path string, fields map[string]json.RawMessage, bodyLen int) int64 {
	if n, ok := detokenizeIDs(path, fields); ok {
		return n
	}
	return int64(bodyLen)
}

// detokenizeIDs counts the token ids of a detokenize request (one list, or a list of lists).
func detokenizeIDs(path string, fields map[string]json.RawMessage) (int64, bool) {
	if path != "/detokenize" && path != "/v1/detokenize" {
		return 0, false
	}
	var ids []json.RawMessage
	if json.Unmarshal(fields["tokens"], &ids) != nil {
		return 0, false
	}
	n := int64(0)
	for _, id := range ids {
		var inner []json.RawMessage
		if json.Unmarshal(id, &inner) == nil {
			n += int64(len(inner))
		} else {
			n++
		}
	}
	return n, true
}

// utilityCount is what a utility request used, as exact as it is known: the ids sent to
// detokenize, the engine's count for tokenize ("count", one or a list per prompt) and
// count_tokens ("input_tokens"), each validated by the one usage reader's rule. Not known: the
// caller charges the reservation.
func utilityCount(path string, fields map[string]json.RawMessage, reply any) (int64, bool) {
	if n, ok := detokenizeIDs(path, fields); ok {
		return n, true
	}
	m, _ := reply.(map[string]any)
	key := "count"
	if path == "/v1/messages/count_tokens" {
		key = "input_tokens"
	}
	switch c := m[key].(type) {
	case []any:
		var sum int64
		for _, one := range c {
			n, ok := backends.Count(one)
			if !ok {
				return 0, false
			}
			sum += n
		}
		return sum, true
	default:
		return backends.Count(c)
	}
}
