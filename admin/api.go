// Package admin is the operator's API, behind the admin key: backends with their capacity, health
// and quarantine (and its release), incidents, and the tenants added at run time. It writes
// OpenAI-shaped errors; the gateway routes /admin/ here.
package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
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
}

// Handle serves an admin route; false means path is none of them.
func (g *API) Handle(ctx *fasthttp.RequestCtx, path, method string) bool {
	if g.statusPage(ctx, path, method) {
		return true
	}
	switch path {
	case "/admin/stats":
		if method != fasthttp.MethodGet {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.stats(ctx)
		}
		return true
	case "/admin/backends":
		if method != fasthttp.MethodGet {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.backendsList(ctx)
		}
		return true
	case "/admin/incidents":
		if method != fasthttp.MethodGet {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.incidents(ctx)
		}
		return true
	}
	if path == "/admin/models/fail-closed" {
		if method != fasthttp.MethodGet {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.failClosedList(ctx)
		}
		return true
	}
	if name, ok := strings.CutPrefix(path, "/admin/models/"); ok && strings.HasSuffix(name, "/clear-fail-closed") {
		if method != fasthttp.MethodPost {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.clearFailClosed(ctx, strings.TrimSuffix(name, "/clear-fail-closed"))
		}
		return true
	}
	if name, ok := strings.CutPrefix(path, "/admin/backends/"); ok && strings.HasSuffix(name, "/release") {
		if method != fasthttp.MethodPost {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.release(ctx, strings.TrimSuffix(name, "/release"))
		}
		return true
	}
	if name, ok := strings.CutPrefix(path, "/admin/backends/"); ok && strings.HasSuffix(name, "/quarantine") {
		if method != fasthttp.MethodPost {
			writeError(ctx, apierr.Method)
		} else if g.Auth(ctx) {
			g.quarantine(ctx, strings.TrimSuffix(name, "/quarantine"))
		}
		return true
	}
	return g.tenants(ctx, path, method)
}

// writeError answers e in OpenAI's envelope (no admin route is Anthropic's).
func writeError(ctx *fasthttp.RequestCtx, e *apierr.Error) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	ctx.SetBody(e.Body(apierr.OpenAI))
}

// Auth answers 401 unless the request carries the admin key (compared in constant time) or,
// without a key, the status page's session cookie (with its CSRF token on changes: sessionAuth).
func (g *API) Auth(ctx *fasthttp.RequestCtx) bool {
	key, ok := g.Bearer(ctx)
	if !ok && g.Key != nil && len(ctx.Request.Header.Cookie(ui.CookieName)) > 0 {
		return g.sessionAuth(ctx)
	}
	if g.Key == nil || !ok {
		writeError(ctx, apierr.Unauthorized)
		return false
	}
	sum := sha256.Sum256(key)
	if subtle.ConstantTimeCompare(sum[:], g.Key) != 1 {
		writeError(ctx, apierr.Unauthorized)
		return false
	}
	return true
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
			writeError(ctx, apierr.BadRequest("limit", "'limit' must be an integer from 1 to 10000."))
			return
		}
		limit = n
	}
	var since time.Time
	if s := string(q.Peek("since")); s != "" {
		t, ok := parseSince(s)
		if !ok {
			writeError(ctx, apierr.BadRequest("since", "'since' must be an RFC 3339 time (2026-12-03T16:00:00Z) or Unix milliseconds."))
			return
		}
		since = t
	}
	tenant := string(q.Peek("tenant"))
	if q.Has("tenant") && tenant == "" {
		writeError(ctx, apierr.BadRequest("tenant", "'tenant' must name a tenant."))
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
		writeError(ctx, apierr.StateUnavailable("The incident store is unreachable: "+err.Error()))
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
		writeError(ctx, backendNotFound(name))
		return
	}
	ttl := g.QuarantineTTL
	if s := ctx.QueryArgs().Peek("ttl"); len(s) > 0 {
		d, err := time.ParseDuration(string(s))
		if err != nil || d <= 0 {
			writeError(ctx, apierr.BadRequest("ttl", "'ttl' must be a positive duration, like 10m."))
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
		writeError(ctx, backendNotFound(name))
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.Quarantines.Release(rctx, name); err != nil {
		writeError(ctx, apierr.StateUnavailable("The quarantine store is unreachable; the backend stays quarantined: "+err.Error()))
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
		writeError(ctx, modelNotFailClosed(model))
		return
	}
	if _, ok := g.FailClosedModels()[model]; !ok {
		writeError(ctx, modelNotFailClosed(model))
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.FailClosed.Release(rctx, model); err != nil {
		writeError(ctx, apierr.StateUnavailable("The shared store is unreachable; the model stays fail-closed: "+err.Error()))
		return
	}
	g.Log.Warn("model's fail-closed admission cleared by an operator", zap.String("model", model))
	writeJSON(ctx, 200, map[string]any{"cleared": model})
}

func modelNotFailClosed(model string) *apierr.Error {
	return &apierr.Error{Status: 404, Type: "invalid_request_error", Code: "not_found", Param: "model",
		Message: fmt.Sprintf("Model %q is not fail-closed.", model)}
}
