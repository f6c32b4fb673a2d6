// Package admin is the operator's API, behind the admin key: backends with their capacity, health
// and quarantine (and its release), incidents, and the tenants added at run time. It writes
// OpenAI-shaped errors; the gateway routes /admin/ here.
package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/admin/ui"
	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/apierr/respond"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
)

// API serves /admin/.
type API struct {
	// Key is the SHA-256 of the admin key; nil disables every admin route (401).
	Key         []byte
	Backends    *backends.Set
	Incidents   state.IncidentLog
	Quarantines *state.Quarantines
	Tenants     *tenants.Directory
	// QuarantineTTL is how long an operator's quarantine lasts unless the request names one.
	QuarantineTTL time.Duration
	Store         state.TenantStore // run-time tenants
	Log           *zap.Logger
	// Bearer is the key the request carries; ReadBody reads a body of at most n bytes (the
	// server streams request bodies).
	Bearer   func(ctx *fasthttp.RequestCtx) ([]byte, bool)
	ReadBody func(ctx *fasthttp.RequestCtx, n int) ([]byte, *apierr.Error)
	// Metrics is the replica's registry, read by /admin/stats; nil answers 503 there.
	Metrics prometheus.Gatherer
	// FailClosed holds the models whose admission is fail-closed after count drift (their
	// release is the operator's clear); FailClosedModels lists them and since when. Nil: none.
	FailClosed       *state.Quarantines
	FailClosedModels func() map[string]time.Time
	// Sessions are the status page's logins (statuspage.go); nil makes one on first use.
	Sessions     *ui.Sessions
	sessionsOnce sync.Once
	// Throttle slows down key guessing per client address (throttle.go); nil: no throttle.
	Throttle *Throttle
}

// Handle serves an admin route; false means path is none of them.
func (g *API) Handle(ctx *fasthttp.RequestCtx, path, method string) bool {
	if g.statusPage(ctx, path, method) {
		return true
	}
	switch path {
	case "/admin/stats":
		if method != fasthttp.MethodGet {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.stats(ctx)
		}
		return true
	case "/admin/backends":
		if method != fasthttp.MethodGet {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.backendsList(ctx)
		}
		return true
	case "/admin/incidents":
		if method != fasthttp.MethodGet {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.incidents(ctx)
		}
		return true
	}
	if path == "/admin/models/fail-closed" {
		if method != fasthttp.MethodGet {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.failClosedList(ctx)
		}
		return true
	}
	if name, ok := strings.CutPrefix(path, "/admin/models/"); ok && strings.HasSuffix(name, "/clear-fail-closed") {
		if method != fasthttp.MethodPost {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.clearFailClosed(ctx, strings.TrimSuffix(name, "/clear-fail-closed"))
		}
		return true
	}
	if name, ok := strings.CutPrefix(path, "/admin/backends/"); ok && strings.HasSuffix(name, "/release") {
		if method != fasthttp.MethodPost {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.release(ctx, strings.TrimSuffix(name, "/release"))
		}
		return true
	}
	if name, ok := strings.CutPrefix(path, "/admin/backends/"); ok && strings.HasSuffix(name, "/quarantine") {
		if method != fasthttp.MethodPost {
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		} else if g.Auth(ctx) {
			g.quarantine(ctx, strings.TrimSuffix(name, "/quarantine"))
		}
		return true
	}
	return g.tenants(ctx, path, method)
}

// Auth answers 401 unless the request carries the admin key (compared in constant time) or,
// without a key, the status page's session cookie (with its CSRF token on changes: sessionAuth).
// A wrong key counts against the client's address (Throttle); while it waits, 429.
func (g *API) Auth(ctx *fasthttp.RequestCtx) bool {
	return g.bearerAuth(ctx, ViaBearer, apierr.Unauthorized, g.Key)
}

// AuthMetrics is /metrics's check: a bearer key whose SHA-256 is one of hashes (the metrics
// key, the admin key; nil ones are skipped), or the status page's session, throttled like the
// admin key. With no hash at all every scraper gets a 401 that says what to configure.
func (g *API) AuthMetrics(ctx *fasthttp.RequestCtx, hashes ...[]byte) bool {
	refusal := apierr.Unauthorized
	if !slices.ContainsFunc(hashes, func(h []byte) bool { return h != nil }) {
		refusal = metricsUnconfigured
	}
	return g.bearerAuth(ctx, ViaMetrics, refusal, hashes...)
}

var metricsUnconfigured = &apierr.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key",
	Message: "/metrics needs a key and none is configured: set server.metrics_key_sha256 (or server.metrics_auth: none, which publishes tenant names)."}

// bearerAuth: the request's bearer key hashes to one of hashes, or it has no key and a live
// session. It writes the refusal (refusal, or the throttle's 429).
func (g *API) bearerAuth(ctx *fasthttp.RequestCtx, via string, refusal *apierr.Error, hashes ...[]byte) bool {
	key, ok := g.Bearer(ctx)
	if !ok && g.Key != nil && len(ctx.Request.Header.Cookie(ui.CookieName)) > 0 {
		return g.sessionAuth(ctx)
	}
	if !ok {
		respond.Error(ctx, refusal, apierr.OpenAI)
		return false
	}
	switch g.tryKey(ctx, key, via, hashes...) {
	case keyThrottled:
		return false
	case keyWrong:
		respond.Error(ctx, refusal, apierr.OpenAI)
		return false
	}
	return true
}

type keyResult int

const (
	keyRight keyResult = iota
	keyWrong
	keyThrottled // refused unchecked; the 429 is written
)

// tryKey checks key against hashes in constant time (every hash compared), unless the client's
// address must wait (then the 429 is written). A wrong key is a strike against the address.
func (g *API) tryKey(ctx *fasthttp.RequestCtx, key []byte, via string, hashes ...[]byte) keyResult {
	now := time.Now()
	addr := clientAddr(ctx)
	if g.Throttle != nil {
		if wait := g.Throttle.Wait(addr, now); wait > 0 {
			g.Throttle.Throttled(via)
			respond.Error(ctx, tooManyFailures(wait), apierr.OpenAI)
			return keyThrottled
		}
	}
	sum := sha256.Sum256(key)
	match := 0
	for _, h := range hashes {
		if h != nil {
			match |= subtle.ConstantTimeCompare(sum[:], h)
		}
	}
	if len(key) > 0 && match == 1 {
		return keyRight
	}
	if g.Throttle != nil {
		g.Throttle.Fail(addr, via, now)
	}
	return keyWrong
}

// clientAddr is the connection's own address: a header such as X-Forwarded-For is the
// client's to forge, and no proxy is configured as trusted.
func clientAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	a, _ := netip.AddrFromSlice(ctx.RemoteIP())
	return a
}

// backendStatus is one row of /admin/backends.
type backendStatus struct {
	Name             string             `json:"name"`
	ConfiguredRole   string             `json:"configured_role"`
	ReportedMode     string             `json:"reported_disaggregation_mode,omitempty"`
	RoleMatches      bool               `json:"role_matches"`
	Usable           bool               `json:"usable"`
	Capacity         *backends.Capacity `json:"capacity,omitempty"`
	LastError        string             `json:"last_error,omitempty"`
	QuarantinedUntil *time.Time         `json:"quarantined_until,omitempty"`

	// PoolAlarm: the pool is smaller than the context or the engine's own max_req_input_len
	// (the leak's precondition); false while capacity is unknown.
	PoolAlarm bool `json:"pool_alarm"`
}

func describeBackend(set *backends.Set, b *backends.Backend, now time.Time) backendStatus {
	st := backendStatus{Name: b.Name, ConfiguredRole: string(b.Role), RoleMatches: b.RoleMatches(), Usable: set.Usable(b, now),
		Capacity: b.Capacity(), LastError: b.LastError()}
	if st.Capacity != nil {
		st.ReportedMode = st.Capacity.Mode
		st.PoolAlarm = st.Capacity.PoolAlarm()
	}
	if q := b.QuarantinedUntil(); q.After(now) {
		st.QuarantinedUntil = &q
	}
	return st
}

func (g *API) backendsList(ctx *fasthttp.RequestCtx) {
	now := time.Now()
	var out []backendStatus
	for _, b := range g.Backends.All() {
		out = append(out, describeBackend(g.Backends, b, now))
	}
	writeJSON(ctx, 200, map[string]any{"backends": out})
}

// incidents answers GET /admin/incidents, newest first: ?limit= (1 to 10000, default 100),
// ?since= (RFC 3339, or Unix milliseconds: incidents at or after it) and ?tenant= (incidents
// whose victim or requester it is), both over the newest maxIncidentScan incidents. A bad
// parameter is a 400 naming it.
func (g *API) incidents(ctx *fasthttp.RequestCtx) {
	q := ctx.QueryArgs()
	limit := 100
	if s := q.Peek("limit"); len(s) > 0 {
		n, err := strconv.Atoi(string(s))
		if err != nil || n < 1 || n > 10000 {
			respond.Error(ctx, apierr.BadRequest("limit", "'limit' must be an integer from 1 to 10000."), apierr.OpenAI)
			return
		}
		limit = n
	}
	var since time.Time
	if s := string(q.Peek("since")); s != "" {
		t, ok := parseSince(s)
		if !ok {
			respond.Error(ctx, apierr.BadRequest("since", "'since' must be an RFC 3339 time (2026-12-03T16:00:00Z) or Unix milliseconds."), apierr.OpenAI)
			return
		}
		since = t
	}
	tenant := string(q.Peek("tenant"))
	if q.Has("tenant") && tenant == "" {
		respond.Error(ctx, apierr.BadRequest("tenant", "'tenant' must name a tenant."), apierr.OpenAI)
		return
	}
	filtered := !since.IsZero() || tenant != ""
	rctx, cancel := storeCtx()
	defer cancel()
	n := limit
	if filtered {
		n = maxIncidentScan // the newest this many, filtered below: a bounded read
	}
	list, err := g.Incidents.List(rctx, n)
	if err != nil {
		respond.Error(ctx, apierr.StateUnavailable("The incident store is unreachable: "+err.Error()), apierr.OpenAI)
		return
	}
	out := make([]state.Incident, 0, min(len(list), limit))
	for _, inc := range list {
		if len(out) == limit {
			break
		}
		if (!since.IsZero() && inc.Time.Before(since)) || (tenant != "" && inc.Victim != tenant && inc.Requester != tenant) {
			continue
		}
		out = append(out, inc)
	}
	writeJSON(ctx, 200, map[string]any{"incidents": out})
}

// maxIncidentScan is how many of the newest incidents a filtered listing reads (the Redis log
// keeps up to 100,000; reading them all for one request would cost tens of megabytes).
const maxIncidentScan = 10000

// parseSince reads ?since=: RFC 3339 (with or without fractions), or Unix milliseconds.
func parseSince(s string) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, true
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil && ms >= 0 && ms < 1<<53 {
		return time.UnixMilli(ms), true
	}
	return time.Time{}, false
}

func backendNotFound(name string) *apierr.Error {
	return &apierr.Error{Status: 404, Type: "invalid_request_error", Code: "not_found", Param: "backend",
		Message: fmt.Sprintf("No backend named %q.", name)}
}

// quarantine takes a backend out of rotation on every replica (maintenance, or a suspicion the
// scanner cannot see), for ?ttl= (a Go duration) or canary.quarantine_ttl; release ends it.
func (g *API) quarantine(ctx *fasthttp.RequestCtx, name string) {
	if g.Backends.Get(name) == nil {
		respond.Error(ctx, backendNotFound(name), apierr.OpenAI)
		return
	}
	ttl := g.QuarantineTTL
	if s := ctx.QueryArgs().Peek("ttl"); len(s) > 0 {
		d, err := time.ParseDuration(string(s))
		if err != nil || d <= 0 {
			respond.Error(ctx, apierr.BadRequest("ttl", "'ttl' must be a positive duration, like 10m."), apierr.OpenAI)
			return
		}
		ttl = d
	}
	g.Quarantines.Mark(name, ttl, "operator")
	rctx, cancel := storeCtx()
	defer cancel()
	shared := g.Quarantines.Share(rctx, name) == nil // on failure it stays local and the sync retries it
	g.Log.Warn("backend quarantined by an operator", zap.String("backend", name), zap.Duration("ttl", ttl), zap.Bool("shared", shared))
	writeJSON(ctx, 200, map[string]any{"quarantined": name, "until": time.Now().Add(ttl).UTC(), "shared": shared})
}

func (g *API) release(ctx *fasthttp.RequestCtx, name string) {
	if g.Backends.Get(name) == nil {
		respond.Error(ctx, backendNotFound(name), apierr.OpenAI)
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.Quarantines.Release(rctx, name); err != nil {
		respond.Error(ctx, apierr.StateUnavailable("The quarantine store is unreachable; the backend stays quarantined: "+err.Error()), apierr.OpenAI)
		return
	}
	g.Log.Warn("backend released from quarantine by an operator", zap.String("backend", name))
	writeJSON(ctx, 200, map[string]any{"released": name})
}

// failClosedModel is one row of /admin/models/fail-closed.
type failClosedModel struct {
	Model string    `json:"model"`
	Since time.Time `json:"since"`
}

// failClosedList answers GET /admin/models/fail-closed: the models whose admission requires
// exact counts after count drift, by name.
func (g *API) failClosedList(ctx *fasthttp.RequestCtx) {
	out := []failClosedModel{}
	if g.FailClosedModels != nil {
		for m, since := range g.FailClosedModels() {
			out = append(out, failClosedModel{Model: m, Since: since.UTC()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	writeJSON(ctx, 200, map[string]any{"fail_closed": out})
}

// clearFailClosed answers POST /admin/models/{model}/clear-fail-closed: the model's admission
// counts as before on every replica (the shared flag first: a failure leaves it in force).
func (g *API) clearFailClosed(ctx *fasthttp.RequestCtx, model string) {
	if g.FailClosed == nil || g.FailClosedModels == nil {
		respond.Error(ctx, modelNotFailClosed(model), apierr.OpenAI)
		return
	}
	if _, ok := g.FailClosedModels()[model]; !ok {
		respond.Error(ctx, modelNotFailClosed(model), apierr.OpenAI)
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.FailClosed.Release(rctx, model); err != nil {
		respond.Error(ctx, apierr.StateUnavailable("The shared store is unreachable; the model stays fail-closed: "+err.Error()), apierr.OpenAI)
		return
	}
	g.Log.Warn("model's fail-closed admission cleared by an operator", zap.String("model", model))
	writeJSON(ctx, 200, map[string]any{"cleared": model})
}

func modelNotFailClosed(model string) *apierr.Error {
	return &apierr.Error{Status: 404, Type: "invalid_request_error", Code: "not_found", Param: "model",
		Message: fmt.Sprintf("Model %q is not fail-closed.", model)}
}
