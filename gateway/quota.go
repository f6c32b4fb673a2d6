package gateway

// Per-tenant limits (rpm, tpm, max_concurrent) and tenants added at run time. The algorithm and
// its state live in package limits; this file is the gateway's side: reserve after the 413 decision,
// observe the reply's usage, settle when the exchange ends, keep the tenant list in sync, and
// the metrics. Hooks into the pipeline are marked "kvgate limits" where they sit.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
)

// limitsState is the gateway's limiter and the run-time tenant store.
type limitsState struct {
	g         *Gateway
	limiter   *limits.Limiter
	store     state.TenantStore
	redis     *state.RedisLimits // nil in memory mode
	replicaID string
	timeout   time.Duration

	ratelimited *prometheus.CounterVec
	reserved    *prometheus.CounterVec
	settled     *prometheus.CounterVec
}

func newLimitsState(g *Gateway) *limitsState {
	cfg := g.cfg
	s := &limitsState{g: g, replicaID: newID(), timeout: cfg.Limits.RedisTimeout}
	if s.timeout <= 0 {
		s.timeout = 100 * time.Millisecond
	}
	s.store = g.state.Tenants
	if s.redis = g.state.Limits; s.redis != nil {
		s.limiter = limits.NewLimiter(s.redis, cfg.Limits.Replicas, s.timeout)
		s.limiter.SetHeartbeat(func() (int, error) {
			ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			defer cancel()
			return s.redis.Heartbeat(ctx, s.replicaID)
		})
	} else {
		s.limiter = limits.NewLimiter(nil, cfg.Limits.Replicas, s.timeout)
	}
	s.limiter.OnChange = func(degraded bool, err error) {
		if degraded {
			g.log.Warn("redis unreachable: each replica now enforces its share of every tenant limit",
				zap.Int("replicas", s.limiter.Replicas()), zap.Error(err))
		} else {
			g.log.Info("redis answers again: tenant limits are shared across replicas again")
		}
	}

	s.ratelimited = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_ratelimited_total",
		Help: "Requests refused with 429, by tenant and the limit that refused (rpm, tpm, max_concurrent)."}, []string{"tenant", "limit"})
	s.reserved = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tokens_reserved_total",
		Help: "Tokens reserved at admission (prompt + output reservation), by tenant."}, []string{"tenant"})
	s.settled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tokens_settled_total",
		Help: "Tokens charged once replies ended (from their usage; what was produced for cut replies; 0 for failed ones), by tenant."}, []string{"tenant"})
	degradedG := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_limits_degraded",
		Help: "1 while Redis is unreachable and this replica enforces its share (limit / replicas) of every tenant limit."},
		func() float64 { return b01(s.limiter.Degraded()) })
	replicasG := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_limits_replicas",
		Help: "The replica count a limit is divided by while Redis is unreachable (configured, or discovered if larger)."},
		func() float64 { return float64(s.limiter.Replicas()) })
	g.metrics.reg.MustRegister(s.ratelimited, s.reserved, s.settled, degradedG, replicasG)
	return s
}

// run keeps the tenant list in sync and runs the limiter's background work until ctx ends.
func (s *limitsState) run(ctx context.Context) {
	go s.limiter.Run(ctx)
	s.g.tenants.Run(ctx)
}

// limitHold is an admitted exchange's claim on its tenant's limits and what its reply used.
// Every admitted exchange has one, tenant limits or not (ticket nil): its usage is what
// kvgate_tokens_total counts for every tenant.
type limitHold struct {
	ticket   *limits.Ticket // nil: the tenant has no limits
	prompt   int64          // reserved prompt tokens (our count, every item)
	output   int64          // reserved output tokens (every item)
	mu       sync.Mutex
	produced bool                // a 2xx reply body or event arrived
	streamed bool                // it arrived as events
	tally    backends.UsageTally // what the engine reported, read by backends' one usage reader
	lastText time.Duration       // since the exchange's start, the last event carrying text (0: none yet)
	itl      prometheus.Observer // kvgate_inter_token_latency_seconds for the exchange's model
}

// reserveLimits is the 429 decision: after the 413 decision (a prompt that can never fit is a
// 413, not a 429), before any backend. It reserves the admission Need (admission.NeedOf: the
// prompt and the output the request may produce). The output of a request that names none is
// owable (limits: owing): the request passes when its prompt fits the tenant's tpm room, is
// charged the whole Need, and the settlement's refund repays what the reply did not use.
func (x *exchange) reserveLimits(ctx *fasthttp.RequestCtx) *apierr.Error {
	ticket, limit, e := x.g.reserveOwing(&ctx.Response.Header, x.tenant, x.need.Tokens(), x.need.Owable, outputParam(x.kind))
	if e != nil {
		e.Reason = "rate_limited_" + limit
		return e
	}
	x.limit = &limitHold{ticket: ticket, prompt: x.need.Prompt, output: x.need.Output}
	return nil
}

// reserve is the 429 decision for tokens of tenant t's limits, all of which must fit (utility
// routes): reserveOwing with nothing owable.
func (g *Gateway) reserve(h *fasthttp.ResponseHeader, t *tenants.Tenant, tokens int64) (*limits.Ticket, string, *apierr.Error) {
	return g.reserveOwing(h, t, tokens, 0, "")
}

// reserveOwing is the 429 decision for tokens of tenant t's limits, of which owable may be owed
// (limits.Limiter.AdmitOwing), on any route: nil ticket and nil error when t has no limits; on a
// refusal, the limit that refused and the client's 429 (named: the request's output field, for
// the message of one that can never pass). Either way the reply gets OpenAI's x-ratelimit-*
// headers for the tenant's rpm and tpm (setHeadroom).
func (g *Gateway) reserveOwing(h *fasthttp.ResponseHeader, t *tenants.Tenant, tokens, owable int64, named string) (*limits.Ticket, string, *apierr.Error) {
	lim := t.Limits()
	if g.lim == nil || lim.None() {
		return nil, "", nil
	}
	ticket, v := g.lim.limiter.AdmitOwing(t.Name, lim, tokens, owable)
	decided := lim
	if ticket != nil {
		decided = ticket.Rates()
	}
	setHeadroom(h, limits.HeadroomAfter(decided, v))
	if !v.Allowed {
		g.lim.ratelimited.WithLabelValues(t.Name, v.Limit).Inc()
		return nil, v.Limit, rateLimited(v, lim, tokens, owable, named)
	}
	g.lim.reserved.WithLabelValues(t.Name).Add(float64(ticket.Reserved()))
	return ticket, "", nil
}

// outputParam names the field that bounds a route's output, for a 429 that says what to lower.
func outputParam(k request.Kind) string {
	switch k {
	case request.Generate:
		return "sampling_params.max_new_tokens"
	case request.Responses:
		return "max_output_tokens"
	}
	return "max_tokens"
}

// setHeadroom writes OpenAI's rate-limit headers, for clients that pace themselves by them:
// x-ratelimit-limit-requests, -remaining-requests, -reset-requests (a Go duration such as "1s" or
// "6m0s", OpenAI's format) and the same for -tokens, each pair only for a limit that is set.
// Remaining tokens are after this request's reservation; settlement may refund some.
func setHeadroom(h *fasthttp.ResponseHeader, r limits.Headroom) {
	if r.RPM > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(r.RPM))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(r.RemainingRequests, 10))
		h.Set("x-ratelimit-reset-requests", r.ResetRequests.String())
	}
	if r.TPM > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.Itoa(r.TPM))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(r.RemainingTokens, 10))
		h.Set("x-ratelimit-reset-tokens", r.ResetTokens.String())
	}
}

// settle ends a ticket from reserve with what was used (nil ticket: nothing to do).
func (g *Gateway) settle(t *tenants.Tenant, ticket *limits.Ticket, used int64) {
	if ticket == nil {
		return
	}
	used = max(used, 0) // counts are validated; a sum is still never allowed to refund more than was held
	g.lim.limiter.Settle(ticket, used)
	g.lim.settled.WithLabelValues(t.Name).Add(float64(used))
}

// rateLimited is the client's 429 for verdict v on lim, for a request of tokens of which owable
// could be owed. One that can never pass (v.Never) has no Retry-After and says what to change:
// the output (named) or the prompt, or the limit.
func rateLimited(v limits.Verdict, lim limits.Rates, tokens, owable int64, named string) *apierr.Error {
	e := &apierr.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", RetryAfter: max(int((v.RetryAfter+time.Second-1)/time.Second), 1)}
	switch v.Limit {
	case limits.TPM:
		e.Type = "tokens"
		switch {
		case v.Never && owable > 0:
			e.RetryAfter = 0 // no wait makes it pass
			e.Message = fmt.Sprintf("Request too large: its prompt alone is %d tokens, more than this API key's limit of %d tokens per minute, so it can never pass. Shorten it or raise tpm.", tokens-owable, lim.TPM)
		case v.Never:
			if named == "" {
				named = "the output"
			}
			e.RetryAfter = 0
			e.Message = fmt.Sprintf("Request too large: it needs %d tokens (prompt and %s), more than this API key's limit of %d tokens per minute, so it can never pass. Lower %s or the prompt, or raise tpm.", tokens, named, lim.TPM, named)
		default:
			e.Message = fmt.Sprintf("Rate limit reached for tokens per minute: limit %d, this request needs %d. Please try again in %ds.", lim.TPM, tokens-owable, e.RetryAfter)
		}
	case limits.Concurrent:
		e.Message = fmt.Sprintf("Too many requests in flight for this API key: limit %d concurrent requests. Please try again when one has finished.", lim.MaxConcurrent)
	default:
		e.Message = fmt.Sprintf("Rate limit reached for requests per minute: limit %d. Please try again in %ds.", lim.RPM, e.RetryAfter)
	}
	if v.Degraded {
		// Not the tenant's whole limit: say so, or a client with nothing in flight elsewhere
		// cannot understand the refusal.
		e.Message += fmt.Sprintf(" (Limits are degraded: the gateway's shared state is unreachable, so each of %d replicas enforces its own share, %d, of this limit until it is back.)",
			v.Replicas, v.Share)
	}
	return e
}

// noteUsage notes a whole (non-streaming, 2xx) reply as the gateway decoded it (nil: the reply
// was produced but not usable, so it carries no usage).
func (x *exchange) noteUsage(reply any) {
	h := x.limit
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.produced = true
	h.tally.Add(reply, false)
}

// noteEvent notes one event of a streamed 2xx reply as the gateway decoded it (nil: an event
// that could not be decoded).
// An event that carries text times the stream: its first is the time to first token (access log
// and histogram), each later one an inter-token gap.
func (x *exchange) noteEvent(data any) {
	h := x.limit
	if h == nil { // every admitted exchange holds one: nothing to note
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.produced, h.streamed = true, true
	before := h.tally.TextEvents
	h.tally.Add(data, true)
	if h.tally.TextEvents != before {
		x.noteTextLocked(h)
	}
}

// notePassed notes a streamed event the reply package passed on without decoding it (no usage
// in it): produced, and a token if it carried text.
func (x *exchange) notePassed(carriesText bool) {
	h := x.limit
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.produced, h.streamed = true, true
	if carriesText {
		h.tally.TextEvents++
		x.noteTextLocked(h)
	}
}

// noteTextLocked times a text event (first token, inter-token latency); h.mu is held.
func (x *exchange) noteTextLocked(h *limitHold) {
	now := max(time.Since(x.start), 1)
	if h.lastText == 0 {
		x.firstToken.Store(int64(now))
		x.g.metrics.ttft.WithLabelValues(x.model).Observe(now.Seconds())
		h.itl = x.g.metrics.itl.WithLabelValues(x.model)
	} else {
		h.itl.Observe((now - h.lastText).Seconds())
	}
	h.lastText = now
}

// settleLimits ends the exchange's hold (from end, once). A reply that produced nothing (engine
// error, transport failure) releases the whole reservation. Otherwise prompt and output are
// charged as the engine reported them (every dialect, see backends/usage.go); a count it did not
// report, or reported beyond what the path's context allows, is replaced by ours: the prompt we
// reserved, and for the output, a token per streamed event that carried text (a stream cut
// early is charged what it produced) or the output reserved for a whole reply. A PD request is
// admitted and settled once, whatever its retries did. It returns the engine's prompt count and
// admission's bound for drift (ok: the engine reported one).
func (x *exchange) settleLimits() (engine, admitted int64, ok bool) {
	h := x.limit
	if h == nil {
		return 0, 0, false
	}
	h.mu.Lock()
	var used int64
	if h.produced {
		p, pk, o, ook := h.tally.Totals()
		if bound := x.usageBound(); bound > 0 && p+o > bound {
			pk, ook = false, false // more than the engine could have computed: not believed
		}
		switch { // for the access log: whose counts were charged
		case pk && ook:
			x.usage = "engine"
		case pk || ook:
			x.usage = "partial"
		default:
			x.usage = "gateway"
		}
		if pk {
			engine, admitted, ok = p, h.prompt, true
		} else {
			p = h.prompt
		}
		if !ook {
			switch {
			case h.streamed:
				o = h.tally.TextEvents
			case h.ticket != nil:
				o = h.ticket.Reserved() - h.prompt
			default:
				o = h.output
			}
		}
		used = p + o
		x.promptTokens, x.outputTokens = p, o
	}
	h.mu.Unlock()
	x.g.settle(x.tenant, h.ticket, used)
	return engine, admitted, ok
}

// usageBound is the most a reply can truthfully report: every item's prompt and every choice's
// output together fit the path's context (0: unknown).
func (x *exchange) usageBound() int64 {
	if x.route == nil || x.route.ContextLen <= 0 || x.req == nil {
		return 0
	}
	return int64(x.route.ContextLen) * int64(max(len(x.req.Prompts), 1)) * int64(max(x.req.N, 1))
}

// degradedReadyBody is /readyz while some shared state is unreachable: what is degraded and how.
// pingFailed: the shared store did not answer /readyz's own ping.
func (g *Gateway) degradedReadyBody(pingFailed bool) []byte {
	body := map[string]any{"status": "ready", "degraded": true}
	var reasons []string
	if pingFailed {
		reasons = append(reasons, fmt.Sprintf("shared state (Redis) not answering a ping within %s", readyPingTimeout))
	}
	if g.degraded() {
		reasons = append(reasons, "shared state (Redis) unreachable: incident writes are queued")
	}
	if g.lim != nil && g.lim.limiter.Degraded() {
		n := g.lim.limiter.Replicas()
		reasons = append(reasons, fmt.Sprintf("shared state (Redis) unreachable: tenant limits are enforced per replica at limit / %d (at least 1)", n))
		body["limits"] = map[string]any{"mode": "local_share", "replicas": n}
	}
	body["reason"] = strings.Join(reasons, "; ")
	b, _ := json.Marshal(body)
	return b
}

func (g *Gateway) limitsDegraded() bool { return g.lim != nil && g.lim.limiter.Degraded() }
