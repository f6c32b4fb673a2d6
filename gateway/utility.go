package gateway

import (
	"errors"
	"fmt"
	"sort"
	"time"

	json "github.com/goccy/go-json"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
)

// The utility routes: tokenize, detokenize and Anthropic's count_tokens. They prefill nothing
// and generate nothing, so they need no admission; they are passed to one healthy engine with
// the tenant's auth, their bodies allow-listed like every other route, their replies normalised
// like every other reply.

var utilityFields = map[string]map[string]bool{
	"/v1/tokenize":              set("model", "prompt", "add_special_tokens"),
	"/tokenize":                 set("model", "prompt", "add_special_tokens"),
	"/v1/detokenize":            set("model", "tokens"),
	"/detokenize":               set("model", "tokens"),
	"/v1/messages/count_tokens": set("model", "messages", "system", "tools", "tool_choice", "thinking"),
}

// utilityTimeout bounds one utility call: they are quick on any engine.
const utilityTimeout = 10 * time.Second

func (g *Gateway) utility(ctx *fasthttp.RequestCtx, path string) {
	start := time.Now()
	rid := requestID(ctx)
	ctx.Response.Header.Set("X-Request-Id", rid)
	status, backend := 0, ""
	defer func() {
		g.metrics.requests.WithLabelValues(path, fmt.Sprint(status)).Inc()
		g.access.Info("request", zap.String("request_id", rid), zap.String("route", path), zap.Int("status", status),
			zap.String("upstream", backend), zap.Duration("latency", time.Since(start)))
	}()
	fail := func(e *apiError) {
		writeError(ctx, e)
		status = e.Status
	}
	t := g.authenticate(ctx)
	if t == nil {
		fail(errUnauthorized)
		return
	}
	body, e := readBody(ctx, g.cfg.MaxBodyBytes)
	if e != nil {
		fail(e)
		return
	}
	if e := checkKeys(body); e != nil {
		fail(e) // an engine reads the first of duplicate or case-variant keys differently
		return
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		fail(badRequest("", "Request body must be a JSON object."))
		return
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !utilityFields[path][k] {
			fail(badRequest(k, fmt.Sprintf("Unsupported field %q for %s.", k, path)))
			return
		}
	}
	b := g.utilityBackend()
	if b == nil {
		fail(noBackend())
		return
	}
	backend = b.Name
	resp, err := b.Call(path, body, utilityTimeout)
	if err != nil {
		g.log.Warn("utility call failed", zap.String("request_id", rid), zap.String("backend", b.Name), zap.Error(err))
		fail(mapUpstreamError(err))
		return
	}
	x := &exchange{g: g, tenant: t, rid: rid}
	// The reply is already read (bounded by backends' maxCallReply); what normalising it costs is
	// charged to upstream.max_buffered_bytes like any whole reply.
	c := g.newCharge()
	defer c.done()
	var out []byte
	if c.reserve(config.ReplyCostFactor * int64(len(resp.Body))) {
		out, _, err = x.normaliseBody(resp.ContentType, resp.Body, c)
	} else {
		err = errReplyBudget
	}
	if errors.Is(err, errReplyBudget) {
		g.metrics.repliesOverBudget.Inc()
		fail(replyOverBudget())
		return
	}
	if err != nil {
		g.log.Warn("utility reply refused", zap.String("request_id", rid), zap.String("backend", b.Name), zap.Error(err))
		fail(upstreamFailed("The engine's reply could not be used."))
		return
	}
	status = resp.Status
	ctx.SetStatusCode(resp.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
}

// utilityBackend is a usable engine, the least loaded (any role: they share the tokenizer).
func (g *Gateway) utilityBackend() *backends.Backend {
	routes, err := g.backends.Routes(time.Now())
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
