// Package gateway is kvgate's HTTP front: the fasthttp server, routes, auth, the request
// pipeline (parse, sanitize, count, admit, forward, relay), error bodies, the access log and
// metrics. It holds nothing persistent: capacity lives in backends, decisions in policy, counting
// in tokenize. It must never forward a request that admission did not pass, nor a client's
// credentials.
package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/admin"
	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/leakwatch"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/telemetry"
	"github.com/kvgate/kvgate/tenants"
	"github.com/kvgate/kvgate/tokenize"
)

// Gateway is one replica: the server and its edge, the stages' own state (limits, queue,
// drift, leak watch), and what Reload swaps.
type Gateway struct {
	cfg      *config.Config
	log      *zap.Logger
	backends *backends.Set
	live                        // what Reload swaps (models.go, reload.go)
	tenants  *tenants.Directory // config tenants plus run-time ones (package tenants)
	operator                    // /admin/ and /metrics
	observe                     // metrics, access log, tracing
	server   *fasthttp.Server
	edge                        // drain, cut and background bookkeeping, oversized marks
	state    *state.State       // what replicas share
	watch    *leakwatch.Watcher // leak detection (package leakwatch)
	drift    *driftMonitor      // count drift and fail-closed models (drift.go)
	lim      *limitsState       // tenant limits and run-time tenants (quota.go)
	// queues: the admission queue at the free KV (queue.go); nil unless queue.enabled.
	queues  *queues
	replies *reply.Budget // upstream.max_buffered_bytes
}

// live is what a reload swaps while requests run.
type live struct {
	count    *admission.Counter            // the default model's counting and calibration (package admission)
	models   atomic.Pointer[modelTable]    // routing by model, a Counter per model (models.go); swapped by Reload
	policy   atomic.Pointer[config.Policy] // policy.*, swapped by Reload
	reloadMu sync.Mutex                    // one Reload at a time
}

// operator is the operator's side: the admin API and the scrape endpoint.
type operator struct {
	admin *admin.API // /admin/ (package admin)
	// metricsKey is the SHA-256 of the scrape key (server.metrics_key_sha256); nil: none.
	metricsKey []byte
	metricsH   fasthttp.RequestHandler
}

// observe is what the gateway reports: metrics, the access log, traces.
type observe struct {
	metrics *metrics
	access  *zap.Logger
	tracing *telemetry.Tracing // nil: tracing off (tracing.go)
	tracer  trace.Tracer
}

// edge is the server's own bookkeeping around requests.
type edge struct {
	draining atomic.Bool
	// cutting is set at the end of a drain, just before every engine reply is cut: a request
	// whose engine call then fails was cut by us, not failed by its engine.
	cutting atomic.Bool
	cutMu   sync.Mutex
	cutIDs  []string // request ids of requests cut at the drain deadline

	bg       sync.WaitGroup // incident writes in flight
	bgMu     sync.Mutex     // guards bgClosed and bg.Add against Shutdown's Wait
	bgClosed bool

	// oversized marks requests (by their header, which lives as long as the connection's
	// RequestCtx) whose declared Content-Length is over max_body_bytes; nOversized counts the
	// marks so that ordinary requests skip the map.
	oversized  sync.Map
	nOversized atomic.Int64
}

// New builds a gateway from cfg with shared state st (nil: in memory); it starts nothing until
// Run and Serve.
func New(cfg *config.Config, set *backends.Set, st *state.State, log *zap.Logger) (*Gateway, error) {
	if st == nil {
		var err error
		if st, err = state.Open(&config.Config{Canary: config.Canary{IncidentTTL: cfg.Canary.IncidentTTL}}, log); err != nil {
			return nil, err
		}
	}
	g := &Gateway{cfg: cfg, log: log.Named("gateway"), backends: set}
	g.access = log.Named("access")
	g.state = st
	g.tenants = tenants.NewDirectory(tenants.FromConfig(cfg.Tenants), st.Tenants, g.log)
	var adminKey []byte
	if cfg.AdminKeySHA256 != "" {
		adminKey, _ = hex.DecodeString(strings.ToLower(cfg.AdminKeySHA256)) // validated by config
	}
	ratio := tokenize.NewSafetyRatio(cfg.Tokenizer.SafetyRatio, cfg.Tokenizer.SafetyRatioMax)
	g.metrics = newMetrics(set, ratio.Get, g.degraded)
	models, err := newModelTable(cfg, set, ratio, g.metrics, g.log)
	if err != nil {
		return nil, err
	}
	g.models.Store(models)
	names := make([]string, len(cfg.Tenants))
	for i, t := range cfg.Tenants {
		names[i] = t.Name
	}
	g.watch = leakwatch.New(leakwatch.Options{Canary: cfg.Canary, ExactTimeout: cfg.Tokenizer.ExactTimeout, Tenants: names, State: st,
		Quarantine: set.SetQuarantine, Registry: g.metrics.reg, Log: g.log, Background: g.goBackground})
	g.tenants.OnAdd = g.watch.AddTenant // run-time tenants' markers are injected and detected like any
	g.policy.Store(&cfg.Policy)
	g.count = models.counter(models.fallback)
	failClosed := st.FailClosed
	if failClosed == nil {
		failClosed = state.NewMemoryQuarantine()
	}
	g.drift = newDriftMonitor(g, failClosed)
	g.lim = newLimitsState(g) // kvgate limits
	if cfg.Queue.Enabled {
		g.queues = newQueues(cfg.Queue, g.metrics.reg)
	}
	throttle := admin.NewThrottle(cfg.Server.AuthThrottle, g.metrics.reg)
	throttle.OnLockout = func(addr netip.Addr, failures int) {
		g.log.Warn("admin or metrics key: client address locked out after repeated wrong keys", zap.String("client_addr", addr.String()),
			zap.Int("failures", failures), zap.Duration("lockout", cfg.Server.AuthThrottle.Lockout))
	}
	g.admin = &admin.API{Key: adminKey, Backends: set, Incidents: st.Incidents, Quarantines: g.watch.Quarantines(), Tenants: g.tenants, QuarantineTTL: cfg.Canary.QuarantineTTL,
		Store: st.Tenants, Log: g.log, Bearer: bearer, ReadBody: readBody, Metrics: g.metrics.reg, Throttle: throttle,
		FailClosed: g.drift.flags, FailClosedModels: g.drift.FailClosed}
	if cfg.Server.MetricsKeySHA256 != "" {
		g.metricsKey, _ = hex.DecodeString(strings.ToLower(cfg.Server.MetricsKeySHA256)) // validated by config
	}
	for _, w := range cfg.Warnings() {
		g.log.Warn(w)
	}
	g.replies = reply.NewBudget(cfg.Upstream.MaxBufferedBytes)
	g.metrics.repliesOverBudget = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_replies_over_budget_total",
		Help: "Non-streaming replies refused (503) because upstream.max_buffered_bytes was spent."})
	g.metrics.reg.MustRegister(g.metrics.repliesOverBudget, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_buffered_reply_bytes",
		Help: "Bytes charged to upstream.max_buffered_bytes now (replies in flight, and finished ones until a collection ran)."},
		func() float64 { return float64(g.replies.InUse()) }))
	g.metricsH = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(g.metrics.reg, promhttp.HandlerOpts{}))
	prev := set.OnCapacityChange
	set.OnCapacityChange = func(b *backends.Backend, old, cur *backends.Capacity) {
		g.metrics.capChanges.WithLabelValues(b.Name).Inc()
		g.modelTab().counter(b.Model).Calibrate(b)
		if prev != nil {
			prev(b, old, cur)
		}
	}
	prevPolled := set.OnPolled
	set.OnPolled = func(b *backends.Backend) {
		// A failed calibration is retried on the poll schedule (backing off) until it succeeds,
		// not only when the engine's capacity changes.
		g.modelTab().counter(b.Model).RetryCalibration(b, time.Now())
		if g.queues != nil {
			g.queues.kick() // a fresh usage reading may free KV for what waits
		}
		if prevPolled != nil {
			prevPolled(b)
		}
	}
	g.server = &fasthttp.Server{
		Handler: g.Handle,
		Name:    "kvgate",
		Logger:  fasthttpLogger{log.With(zap.String("component", "fasthttp"))},
		// The body is read by the handler itself, so an oversized one gets our own 413 JSON
		// instead of fasthttp's plain 400 (field-notes.md).
		StreamRequestBody:  true,
		MaxRequestBodySize: cfg.MaxBodyBytes,
		// Server.ReadTimeout is fasthttp's deadline for the request's first bytes and headers;
		// headerReceived then gives the body a deadline of its own. Replies (streams) have none.
		ReadTimeout: cfg.Server.HeaderTimeout,
		// A declared Content-Length over the limit is refused from the headers: fasthttp would
		// otherwise pre-read up to 8 KiB of body (waiting up to the read timeout for a client that
		// sends only headers) or, with "Expect: 100-continue", invite the whole upload first.
		HeaderReceived: g.headerReceived,
		ExpectHandler:  g.expect,
		IdleTimeout:    cfg.Server.IdleTimeout,
		ReadBufferSize: cfg.Server.MaxHeaderBytes, // fasthttp's bound on the request line and headers
		Concurrency:    cfg.Server.MaxConns,
		MaxConnsPerIP:  cfg.Server.MaxConnsPerIP,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			var small *fasthttp.ErrSmallBuffer
			var netErr net.Error
			switch {
			case errors.Is(err, fasthttp.ErrBodyTooLarge) || g.nOversized.Load() > 0 && g.isOversized(&ctx.Request.Header):
				ctx.SetConnectionClose()
				// The envelope comes from the mark: after the failed read the request's path may
				// already be gone, and /v1/messages must still get Anthropic's.
				env, marked := g.takeOversized(ctx)
				if !marked {
					env = pathEnvelope(ctx.Path())
				}
				writeErrorIn(ctx, apierr.TooLarge(cfg.MaxBodyBytes), env)
			case errors.As(err, &small):
				writeError(ctx, &apierr.Error{Status: 431, Type: "invalid_request_error", Code: "request_header_too_large",
					Message: "Request headers are larger than the gateway accepts (" + strconv.Itoa(cfg.Server.MaxHeaderBytes) + " bytes)."})
			case errors.As(err, &netErr) && netErr.Timeout():
				writeError(ctx, apierr.RequestTimeout)
			default:
				// The parser's own text is not echoed: it may quote the client's bytes.
				writeError(ctx, apierr.BadRequest("", "Malformed HTTP request."))
			}
		},
		NoDefaultServerHeader: true,
		CloseOnShutdown:       true,
	}
	return g, nil
}

// Run does the gateway's background work until ctx ends: marker rotation, the shared
// quarantine sync (so every replica sees a flag within one poll interval) and, with Redis, the
// incident queue flusher.
func (g *Gateway) Run(ctx context.Context) {
	if g.state.Run != nil {
		go panics.Loop(ctx, g.log, "state_sync", time.Second, g.state.Run)
	}
	go panics.Loop(ctx, g.log, "limits_sync", time.Second, g.lim.run) // tenant sync, limiter recovery, heartbeat
	g.watch.Run(ctx)
	panics.Loop(ctx, g.log, "quarantine_sync", time.Second, g.syncLoop)
}

// syncLoop pulls quarantine flags and rotates markers every poll interval until ctx ends.
func (g *Gateway) syncLoop(ctx context.Context) {
	t := time.NewTicker(g.cfg.Capacity.PollInterval)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		g.watch.Sync(sctx, time.Now())
		g.drift.flags.Sync(sctx)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recoverRequest, deferred by Handle, keeps a panic in one request from taking the process (and
// every other tenant's requests) with it: the client gets a 500 in its route's envelope.
func (g *Gateway) recoverRequest(ctx *fasthttp.RequestCtx) {
	if v := recover(); v != nil {
		panics.Note(g.log, "request", v)
		ctx.SetConnectionClose()
		writeError(ctx, apierr.Internal)
	}
}

func (g *Gateway) degraded() bool { return g.state.Degraded != nil && g.state.Degraded() }

// Serve accepts connections on ln until Shutdown.
func (g *Gateway) Serve(ln net.Listener) error { return g.server.Serve(ln) }

// Shutdown stops accepting, lets requests in flight finish (bounded by ctx), then returns.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.draining.Store(true)
	err := g.server.ShutdownWithContext(ctx)
	g.waitBackground()
	return err
}

// waitBackground lets incidents recorded by the last requests reach the store (or its queue).
func (g *Gateway) waitBackground() {
	g.bgMu.Lock()
	g.bgClosed = true
	g.bgMu.Unlock()
	g.bg.Wait()
	// Settlements and fingerprint records wait in batches for their next round trip: send them
	// now, so nothing the last requests charged, refunded or fingerprinted is lost.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g.lim.limiter.Flush(ctx)
	g.watch.Flush(ctx)
}

// StartDrain is a drain's first phase (server.drain_delay): /readyz answers 503 draining so that
// load balancers move traffic away, while requests are still served and connections accepted.
func (g *Gateway) StartDrain() { g.draining.Store(true) }

// DrainCutGrace is how long, after the drain deadline cut every engine reply, the cut streams
// get to write their error events and access lines before the server stops waiting for them.
const DrainCutGrace = 2 * time.Second

// DrainResult is what a drain had to cut: nothing when Cut and Open are empty.
type DrainResult struct {
	// Cut are the request ids of requests still open at the deadline, ended with a 503
	// shutting_down (an error event in the route's shape for a stream).
	Cut []string
	// Open is how many client connections were still open DrainCutGrace after the cut (a
	// client not reading its stream, a request not waiting on an engine).
	Open int
}

// Drain is a drain's second phase: stop accepting, let requests in flight finish for up to
// timeout, then cut every engine reply still being read, so each open stream ends with an error
// event and an access line instead of a reset connection.
func (g *Gateway) Drain(timeout time.Duration) DrainResult {
	g.draining.Store(true)
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.server.ShutdownWithContext(sctx) }()
	var res DrainResult
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	select {
	case <-done:
	case <-deadline.C:
		g.cutting.Store(true)
		g.backends.CutStreams()
		grace := time.NewTimer(DrainCutGrace)
		defer grace.Stop()
		select {
		case <-done:
		case <-grace.C:
			res.Open = int(g.server.GetOpenConnectionsCount())
			cancel()
			<-done
		}
		g.cutMu.Lock()
		res.Cut = append([]string(nil), g.cutIDs...)
		g.cutMu.Unlock()
	}
	g.waitBackground()
	return res
}

// headerReceived runs as soon as a request's headers are parsed. For a declared body over the
// limit it makes the body pre-read fail at once (a 1 ns read deadline, at most 1 byte), so the
// error handler answers 413 without waiting for the body; the mark tells it why the read failed.
func (g *Gateway) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if g.nOversized.Load() > 0 {
		g.clearOversized(h) // a mark left by an earlier request on this connection's context
	}
	if h.ContentLength() <= g.cfg.MaxBodyBytes {
		return fasthttp.RequestConfig{ReadTimeout: g.cfg.Server.ReadTimeout}
	}
	if _, loaded := g.oversized.LoadOrStore(h, pathEnvelope(h.RequestURI())); !loaded {
		g.nOversized.Add(1)
	}
	return fasthttp.RequestConfig{ReadTimeout: time.Nanosecond, MaxRequestBodySize: 1}
}

// expect answers "Expect: 100-continue" with the 413 instead of inviting an oversized upload.
func (g *Gateway) expect(ctx *fasthttp.RequestCtx) int {
	if ctx.Request.Header.ContentLength() > g.cfg.MaxBodyBytes {
		g.clearOversized(&ctx.Request.Header)
		writeError(ctx, apierr.TooLarge(g.cfg.MaxBodyBytes))
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}

// takeOversized reports (and clears) the oversized mark of ctx's request: the error envelope of
// the path it was sent to.
func (g *Gateway) takeOversized(ctx *fasthttp.RequestCtx) (apierr.Envelope, bool) {
	if g.nOversized.Load() == 0 {
		return 0, false
	}
	if v, ok := g.oversized.LoadAndDelete(&ctx.Request.Header); ok {
		g.nOversized.Add(-1)
		return v.(apierr.Envelope), true
	}
	return 0, false
}

func (g *Gateway) isOversized(h *fasthttp.RequestHeader) bool {
	_, ok := g.oversized.Load(h)
	return ok
}

func (g *Gateway) clearOversized(h *fasthttp.RequestHeader) bool {
	if _, ok := g.oversized.LoadAndDelete(h); ok {
		g.nOversized.Add(-1)
		return true
	}
	return false
}

// Handle routes one request.
func (g *Gateway) Handle(ctx *fasthttp.RequestCtx) {
	defer g.recoverRequest(ctx)
	if g.nOversized.Load() > 0 {
		g.clearOversized(&ctx.Request.Header) // its first body byte was already buffered: readBody refuses it
	}
	if e := framingError(ctx); e != nil { // request smuggling shapes (framing.go)
		ctx.SetConnectionClose()
		writeError(ctx, e)
		return
	}
	// The generation routes are looked up without a string of the path (a map index converts
	// without allocating); everything else is rarer.
	if kind, ok := request.ByPath[string(ctx.Path())]; ok {
		g.onlyPost(ctx, ctx.IsPost(), kind)
		return
	}
	path := string(ctx.Path())
	method := string(ctx.Method())
	switch path {
	case "/v1/tokenize", "/tokenize", "/v1/detokenize", "/detokenize", "/v1/messages/count_tokens":
		if method != fasthttp.MethodPost {
			writeError(ctx, apierr.Method)
			return
		}
		g.utility(ctx, path)
	case "/healthz":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	case "/readyz":
		g.readyz(ctx)
	case "/metrics":
		if g.cfg.Server.MetricsListen != "" {
			writeError(ctx, apierr.NotFound) // served on server.metrics_listen only
			return
		}
		g.ServeMetrics(ctx)
	case "/v1/models":
		if method != fasthttp.MethodGet {
			writeError(ctx, apierr.Method)
			return
		}
		g.listModels(ctx, "", false)
	default:
		if id, ok := strings.CutPrefix(path, "/v1/models/"); ok && id != "" {
			if method != fasthttp.MethodGet {
				writeError(ctx, apierr.Method)
				return
			}
			g.listModels(ctx, id, true)
			return
		}
		if strings.HasPrefix(path, "/admin/") && g.admin.Handle(ctx, path, method) {
			return
		}
		writeError(ctx, apierr.NotFound)
	}
}

func (g *Gateway) onlyPost(ctx *fasthttp.RequestCtx, post bool, kind request.Kind) {
	if !post {
		writeError(ctx, apierr.Method)
		return
	}
	g.generate(ctx, kind)
}

// authenticate maps the bearer key to a tenant. Every tenant's hash is compared in constant
// time, so timing says nothing about which (or whether a) prefix matched.
func (g *Gateway) authenticate(ctx *fasthttp.RequestCtx) *tenants.Tenant {
	key, ok := bearer(ctx)
	if !ok {
		return nil
	}
	return g.tenants.ByKey(key)
}

// bearer is the client's key: "Authorization: Bearer KEY", or on Anthropic's routes the
// "x-api-key" header its SDKs send.
func bearer(ctx *fasthttp.RequestCtx) ([]byte, bool) {
	if anthropicPath(ctx.Path()) {
		if k := ctx.Request.Header.Peek("X-Api-Key"); len(k) > 0 {
			return k, true
		}
	}
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	const p = "Bearer "
	if len(h) <= len(p) || !strings.EqualFold(string(h[:len(p)]), p) {
		return nil, false
	}
	return h[len(p):], true
}

// ServeMetrics answers /metrics (on the main listener, or alone on server.metrics_listen). The
// series name tenants and backends with their token volumes, so by default (server.metrics_auth
// key) it needs the scrape key or the admin key; admin: the admin key only; none: public.
func (g *Gateway) ServeMetrics(ctx *fasthttp.RequestCtx) {
	switch g.cfg.Server.MetricsAuth {
	case config.MetricsAuthNone:
	case config.MetricsAuthAdmin:
		if !g.admin.AuthMetrics(ctx, g.admin.Key) {
			return
		}
	default:
		if !g.admin.AuthMetrics(ctx, g.metricsKey, g.admin.Key) {
			return
		}
	}
	g.metricsH(ctx)
}

// readyPingTimeout bounds /readyz's ping of the shared store: a probe must answer quickly, and a
// Redis slower than this would hold every limiter call to its own bound anyway.
const readyPingTimeout = 250 * time.Millisecond

// readyz is the load balancer's readiness probe: 503 while draining, before every backend was
// read, and while no route can take traffic (every request would get 503 no_backend); 200 with
// "degraded" while shared state is unreachable (still serving from local state).
func (g *Gateway) readyz(ctx *fasthttp.RequestCtx) {
	if g.draining.Load() {
		writeJSON(ctx, 503, []byte(`{"status":"draining"}`))
		return
	}
	if !g.backends.Ready() {
		writeJSON(ctx, 503, []byte(`{"status":"starting","reason":"not every backend has been read yet"}`))
		return
	}
	if why := g.backends.Unavailable(time.Now()); why != "" {
		body, _ := json.Marshal(map[string]string{"status": "unavailable", "reason": why})
		writeJSON(ctx, 503, body)
		return
	}
	pctx, cancel := context.WithTimeout(context.Background(), readyPingTimeout)
	pingErr := g.state.Ping(pctx)
	cancel()
	if pingErr != nil || g.degraded() || g.limitsDegraded() { // kvgate limits: limits enforced per replica
		// Still serving from local state: ready, but say so.
		writeJSON(ctx, 200, g.degradedReadyBody(pingErr != nil))
		return
	}
	writeJSON(ctx, 200, []byte(`{"status":"ready"}`))
}

func routeError(err error) *apierr.Error {
	if errors.Is(err, backends.ErrCapacityUnknown) {
		return apierr.CapacityUnknown()
	}
	return apierr.NoBackend()
}

// idLen is the length of newID's ids: "kvg-" and 24 hex digits.
const idLen = 4 + 24

// newID is a fresh random request id.
func newID() string {
	var out [idLen]byte // one allocation: the string itself
	putID(out[:])
	return string(out[:])
}

// putID writes a fresh id into out[:idLen].
func putID(out []byte) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	copy(out, "kvg-")
	hex.Encode(out[4:idLen], b[:])
}

// requestIDs are an exchange's client-facing id (the client's when sane) and the engines' rid,
// always ours: the two fresh ones share one allocation. The reply carries the first as
// X-Request-Id from here, whatever it turns out to be (the one place it is set).
func requestIDs(ctx *fasthttp.RequestCtx) (rid, engineRID string) {
	if id := ctx.Request.Header.Peek("X-Request-Id"); len(id) > 0 && len(id) <= 128 && printable(id) {
		rid, engineRID = string(id), newID()
	} else {
		var out [2 * idLen]byte
		putID(out[:idLen])
		putID(out[idLen:])
		both := string(out[:])
		rid, engineRID = both[:idLen], both[idLen:]
	}
	ctx.Response.Header.Set("X-Request-Id", rid)
	return rid, engineRID
}

func printable(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
