package gateway

// Per-tenant limits (rpm, tpm, max_concurrent) and tenants added at run time. The decision and
// its state live in policy; this file is the gateway's side: reserve after the 413 decision,
// observe the reply's usage, settle when the exchange ends, keep the tenant list in sync, and
// the metrics. Hooks into the pipeline are marked "kvgate limits" where they sit.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/state"
)

// tenantSyncInterval is how often a replica checks the shared tenant list's version: a tenant
// added or deleted on one replica is seen by every other within it (well under one second).
const tenantSyncInterval = 250 * time.Millisecond

// limitsState is the gateway's limiter, tenant store and the current tenant list.
type limitsState struct {
	g         *Gateway
	limiter   *policy.Limiter
	store     state.TenantStore
	redis     *state.RedisLimits // nil in memory mode
	replicaID string
	timeout   time.Duration

	// all is what authenticate reads: the config tenants, then those added at run time.
	all     atomic.Pointer[[]tenant]
	syncMu  sync.Mutex // one sync at a time (the loop and admin writes)
	version int64
	synced  bool

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
		s.limiter = policy.NewLimiter(s.redis, cfg.Limits.Replicas, s.timeout)
		s.limiter.SetHeartbeat(func() (int, error) {
			ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			defer cancel()
			return s.redis.Heartbeat(ctx, s.replicaID)
		})
	} else {
		s.limiter = policy.NewLimiter(nil, cfg.Limits.Replicas, s.timeout)
	}
	s.limiter.OnChange = func(degraded bool, err error) {
		if degraded {
			g.log.Warn("redis unreachable: each replica now enforces its share of every tenant limit",
				zap.Int("replicas", s.limiter.Replicas()), zap.Error(err))
		} else {
			g.log.Info("redis answers again: tenant limits are shared across replicas again")
		}
	}
	base := g.tenants
	s.all.Store(&base)

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

// tenantList is the current tenant list (never nil after New).
func (g *Gateway) tenantList() []tenant {
	if g.lim == nil {
		return g.tenants
	}
	return *g.lim.all.Load()
}

// run keeps the tenant list in sync and runs the limiter's background work until ctx ends.
func (s *limitsState) run(ctx context.Context) {
	go s.limiter.Run(ctx)
	t := time.NewTicker(tenantSyncInterval)
	defer t.Stop()
	for {
		s.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sync reloads the run-time tenants when the store's version moved. With the store unreachable
// the last list stays in force.
func (s *limitsState) sync(ctx context.Context) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := s.store.Version(c)
	if err != nil || (s.synced && v == s.version) {
		return
	}
	recs, err := s.store.List(c)
	if err != nil {
		return
	}
	s.version, s.synced = v, true
	list := append([]tenant(nil), s.g.tenants...)
	taken := map[string]bool{}
	for _, t := range s.g.tenants {
		taken["n:"+t.Name], taken["k:"+hex.EncodeToString(t.hash)] = true, true
	}
	for _, r := range recs {
		key := strings.ToLower(r.KeySHA256)
		h, err := hex.DecodeString(key)
		if err != nil || len(h) != 32 || taken["n:"+r.Name] || taken["k:"+key] {
			// The admin API refuses these; one written around it must not shadow a config tenant.
			s.g.log.Warn("ignoring a run-time tenant that clashes with the config file or has a bad key", zap.String("tenant", r.Name))
			continue
		}
		taken["n:"+r.Name], taken["k:"+key] = true, true
		list = append(list, tenant{Tenant: config.Tenant{Name: r.Name, KeySHA256: key, MaxPromptTokens: r.MaxPromptTokens,
			CanaryOptOut: r.CanaryOptOut, RPM: r.RPM, TPM: r.TPM, MaxConcurrent: r.MaxConcurrent}, hash: h})
		if s.g.keyring != nil {
			s.g.keyring.AddTenant(r.Name) // its markers are injected and detected like any tenant's
		}
	}
	s.all.Store(&list)
}

func limitsOf(t *tenant) policy.Limits {
	return policy.Limits{RPM: t.RPM, TPM: t.TPM, MaxConcurrent: t.MaxConcurrent}
}

// limitHold is an admitted exchange's claim on its tenant's limits and what its reply used.
type limitHold struct {
	ticket   *policy.Ticket
	prompt   int64 // reserved prompt tokens (our count)
	once     sync.Once
	mu       sync.Mutex
	usage    bool             // the reply reported usage
	total    int64            // OpenAI usage: prompt + completion
	perIndex map[int][2]int64 // /generate meta_info: per index, prompt and completion so far
	events   int64            // data events relayed (a token each, for streams without usage)
}

// reserveLimits is the 429 decision: after the 413 (a prompt that can never fit is a 413, not a
// 429), before any backend. It reserves the prompt and the output the request may produce.
func (x *exchange) reserveLimits() *apierr.Error {
	g := x.g
	lim := limitsOf(x.tenant)
	if g.lim == nil || lim.None() {
		return nil
	}
	items := int64(max(len(x.req.Prompts), 1))
	output := x.req.Output
	if !x.req.OutputGiven {
		output = g.cfg.Policy.DefaultMaxTokens * max(x.req.N, 1)
	}
	prompt := int64(x.decision.Tokens) * items // the largest prompt's count bounds each one
	tokens := prompt + int64(output)*items
	ticket, v := g.lim.limiter.Admit(x.tenant.Name, lim, tokens)
	if !v.Allowed {
		g.lim.ratelimited.WithLabelValues(x.tenant.Name, v.Limit).Inc()
		x.reason = "rate_limited_" + v.Limit
		return rateLimited(v, lim, tokens)
	}
	g.lim.reserved.WithLabelValues(x.tenant.Name).Add(float64(ticket.Reserved()))
	x.limit = &limitHold{ticket: ticket, prompt: prompt}
	return nil
}

func rateLimited(v policy.Verdict, lim policy.Limits, tokens int64) *apierr.Error {
	e := &apierr.Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded", RetryAfter: max(int((v.RetryAfter+time.Second-1)/time.Second), 1)}
	switch v.Limit {
	case policy.LimitTPM:
		e.Type = "tokens"
		if v.Never {
			e.Message = fmt.Sprintf("Request too large: it needs %d tokens (prompt and requested output), more than this API key's limit of %d tokens per minute. Reduce the prompt or max_tokens.", tokens, lim.TPM)
		} else {
			e.Message = fmt.Sprintf("Rate limit reached for tokens per minute: limit %d, this request needs %d. Please try again in %ds.", lim.TPM, tokens, e.RetryAfter)
		}
	case policy.LimitConcurrent:
		e.Message = fmt.Sprintf("Too many requests in flight for this API key: limit %d concurrent requests. Please try again when one has finished.", lim.MaxConcurrent)
	default:
		if lim.RPM > 0 {
			e.Message = fmt.Sprintf("Rate limit reached for requests per minute: limit %d. Please try again in %ds.", lim.RPM, e.RetryAfter)
		} else {
			e.Message = "Rate limit reached: this replica cannot grant a share of this API key's limit while shared state is unreachable. Please try again shortly."
		}
	}
	return e
}

// usageReport is what a reply says it used: OpenAI's usage, or /generate's meta_info.
type usageReport struct {
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
	Meta *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"meta_info"`
	Index int `json:"index"`
}

func (h *limitHold) note(u *usageReport) {
	switch {
	case u.Usage != nil:
		h.usage, h.total = true, u.Usage.PromptTokens+u.Usage.CompletionTokens
	case u.Meta != nil:
		if h.perIndex == nil {
			h.perIndex = map[int][2]int64{}
		}
		p := h.perIndex[u.Index]
		h.perIndex[u.Index] = [2]int64{max(p[0], u.Meta.PromptTokens), max(p[1], u.Meta.CompletionTokens)}
	}
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
	h.events++                          // something was produced
	if items, ok := reply.([]any); ok { // a /generate batch: one object per item
		for i, it := range items {
			if u, ok := usageOf(it); ok {
				u.Index = i
				h.note(&u)
			}
		}
		return
	}
	if u, ok := usageOf(reply); ok {
		h.note(&u)
	}
}

// noteEvent notes one event of a streamed 2xx reply as the gateway decoded it (nil: an event
// that could not be decoded).
func (x *exchange) noteEvent(data any) {
	h := x.limit
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	u, ok := usageOf(data)
	if !ok || u.Usage == nil {
		h.events++
	}
	if ok {
		h.note(&u)
	}
}

// usageOf reads usage (OpenAI) or meta_info (native) token counts from a decoded reply object.
func usageOf(v any) (usageReport, bool) {
	var u usageReport
	m, _ := v.(map[string]any)
	if m == nil {
		return u, false
	}
	counts := func(sec string) (p, c int64, ok bool) {
		s, _ := m[sec].(map[string]any)
		if s == nil {
			return 0, 0, false
		}
		// A count the engine got wrong (negative, fractional, huge, not a number) makes the
		// whole reading unknown: settlement then charges what was reserved, never less.
		p, okP := tokenCount(s["prompt_tokens"])
		c, okC := tokenCount(s["completion_tokens"])
		return p, c, okP && okC
	}
	if p, c, ok := counts("usage"); ok {
		u.Usage = &struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		}{p, c}
	}
	if p, c, ok := counts("meta_info"); ok {
		u.Meta = &struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		}{p, c}
	}
	if idx := jsonInt(m["index"]); idx > 0 {
		u.Index = int(idx)
	}
	return u, u.Usage != nil || u.Meta != nil
}

// maxTokenCount bounds a token count an engine may report for one request: far above any context
// served today, far below what overflows a sum of a batch's counts.
const maxTokenCount = 1 << 31

// tokenCount validates one token count an engine reported: a JSON integer in [0, maxTokenCount].
// Anything else (absent, negative, 1.5, 1e9, a string) is not a reading.
func tokenCount(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i < 0 || i > maxTokenCount {
		return 0, false
	}
	return i, true
}

// jsonInt is a decoded JSON integer (0 when absent or not an integer).
func jsonInt(v any) int64 {
	n, _ := v.(json.Number)
	i, err := n.Int64()
	if err != nil {
		return 0
	}
	return i
}

// settleLimits ends the exchange's hold, once: the reply's reported usage when it gave one;
// else, for a reply that produced something, the prompt plus a token per event relayed (a
// streamed chunk carries about one), or the reservation for a whole reply without usage; a reply
// that produced nothing (engine error, transport failure) releases the whole reservation. A PD
// request is admitted and settled once, whatever its retries did.
func (x *exchange) settleLimits() {
	h := x.limit
	if h == nil {
		return
	}
	h.once.Do(func() {
		h.mu.Lock()
		var used int64
		switch {
		case h.usage:
			used = h.total
		case len(h.perIndex) > 0:
			for _, p := range h.perIndex {
				used += p[0] + p[1]
			}
		case h.events == 0 || x.status < 200 || x.status > 299:
			used = 0
		case x.req != nil && x.req.Stream:
			used = h.prompt + h.events
		default:
			used = h.ticket.Reserved()
		}
		h.mu.Unlock()
		used = max(used, 0) // counts are validated; a sum is still never allowed to refund more than was held
		x.g.lim.limiter.Settle(h.ticket, used)
		x.g.lim.settled.WithLabelValues(x.tenant.Name).Add(float64(used))
	})
}

// degradedReadyBody is /readyz while some shared state is unreachable: what is degraded and how.
func (g *Gateway) degradedReadyBody() []byte {
	body := map[string]any{"status": "ready", "degraded": true}
	var reasons []string
	if g.degraded() {
		reasons = append(reasons, "shared state (Redis) unreachable: incident writes are queued")
	}
	if g.lim != nil && g.lim.limiter.Degraded() {
		n := g.lim.limiter.Replicas()
		reasons = append(reasons, fmt.Sprintf("shared state (Redis) unreachable: tenant limits are enforced per replica at limit / %d", n))
		body["limits"] = map[string]any{"mode": "local_share", "replicas": n}
	}
	body["reason"] = strings.Join(reasons, "; ")
	b, _ := json.Marshal(body)
	return b
}

func (g *Gateway) limitsDegraded() bool { return g.lim != nil && g.lim.limiter.Degraded() }
