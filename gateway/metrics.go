package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/panics"
)

// Version is the build's version, set by the binary at start (its -ldflags value) and shown by
// kvgate_build_info.
var Version = "dev"

// metrics are the gateway's Prometheus series. Backend capacity is read from the backend set at
// scrape time, so the poller keeps no metric state of its own.
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec
	admitSeconds prometheus.Histogram
	upstream     *prometheus.CounterVec
	requests     *prometheus.CounterVec
	capChanges   *prometheus.CounterVec
	exactCalls   *prometheus.CounterVec
	calibrations *prometheus.CounterVec
	ratio        prometheus.GaugeFunc

	degraded prometheus.GaugeFunc

	// upstream.max_buffered_bytes (budget.go): replies refused because it was spent
	repliesOverBudget prometheus.Counter

	// Per request, by model (a bounded label, see modelLabels): time to first token and between
	// tokens of streams, end-to-end duration of every request, tokens of every tenant.
	ttft     *prometheus.HistogramVec
	itl      *prometheus.HistogramVec
	duration *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	models   modelLabels

	// The children the request path uses, by label values (children.get): resolved once each.
	decisionsC, upstreamC, requestsC, tokensC children[prometheus.Counter]
	durationC                                 children[prometheus.Observer]

	// kvgate overhead (overhead.go): the vector and its three children, resolved once.
	overhead                                      *prometheus.HistogramVec
	overheadBefore, overheadAfter, overheadStream prometheus.Observer

	// configuration reloads (reload.go)
	reload reloadGauges
}

func newMetrics(set *backends.Set, ratio func() float64, degraded func() bool) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), models: modelLabels{set: set}}
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_admission_decisions_total",
		Help: "Admission decisions by outcome, reason and the counting tier that decided."}, []string{"decision", "reason", "tier"})
	m.admitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvgate_admission_seconds",
		Help: "Time to parse, count and decide one request.", Buckets: prometheus.ExponentialBuckets(5e-6, 4, 10)})
	m.upstream = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_upstream_responses_total",
		Help: "Engine responses by backend and HTTP status code; transport errors by name (timeout, connection_refused, reset, tls, other)."}, []string{"backend", "code"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_requests_total",
		Help: "Requests by route and the status the client got."}, []string{"route", "code"})
	m.capChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_backend_capacity_changes_total",
		Help: "Times a backend's reported limits changed (first reading included)."}, []string{"backend"})
	m.exactCalls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_exact_count_calls_total",
		Help: "Calls to engines' /tokenize for gray-zone prompts, by result (ok, error, saturated)."}, []string{"result"})
	m.calibrations = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tokenizer_calibrations_total",
		Help: "Attempts to calibrate an engine's tokenizer against its /tokenize, by result (ok, failed: estimates for its paths stay refuse-only and it is retried)."}, []string{"backend", "result"})
	m.ratio = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_tokenizer_safety_ratio",
		Help: "Current safety ratio applied to tiktoken estimates."}, ratio)
	m.degraded = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_state_degraded",
		Help: "1 while the shared store (Redis) is unreachable and incident writes queue in memory."}, func() float64 { return b01(degraded()) })
	m.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_time_to_first_token_seconds",
		Help:    "Streams: time from the request's arrival to the first event carrying generated text, by model.",
		Buckets: []float64{.025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40, 80}}, []string{"model"})
	m.itl = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_inter_token_latency_seconds",
		Help:    "Streams: time between consecutive events carrying generated text, by model.",
		Buckets: []float64{.005, .01, .02, .04, .06, .08, .1, .15, .25, .5, 1, 2.5}}, []string{"model"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_request_duration_seconds",
		Help:    "End to end: from a request's arrival to the end of its reply (a stream's last byte), every outcome, by model and route.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}}, []string{"model", "route"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_tokens_total",
		Help: "Tokens of generation requests, every tenant: input (prompt) and output, as the engine reported them (our count where it did not), by tenant, model and direction."},
		[]string{"tenant", "model", "direction"})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_build_info",
		Help: "1, labelled with the build's version, VCS revision and Go version."}, []string{"version", "revision", "go_version"})
	build.WithLabelValues(Version, buildRevision(), runtime.Version()).Set(1)
	m.decisionsC = children[prometheus.Counter]{n: 3, with: m.decisions.WithLabelValues}
	m.upstreamC = children[prometheus.Counter]{n: 2, with: m.upstream.WithLabelValues}
	m.requestsC = children[prometheus.Counter]{n: 2, with: m.requests.WithLabelValues}
	m.tokensC = children[prometheus.Counter]{n: 3, with: m.tokens.WithLabelValues}
	m.durationC = children[prometheus.Observer]{n: 2, with: m.duration.WithLabelValues}
	m.reg.MustRegister(m.ttft, m.itl, m.duration, m.tokens, build)
	m.overhead = newOverheadHistogram() // kvgate overhead
	m.overheadBefore = m.overhead.WithLabelValues(phaseBeforeUpstream)
	m.overheadAfter = m.overhead.WithLabelValues(phaseAfterHeaders)
	m.overheadStream = m.overhead.WithLabelValues(phaseStreamRead)
	m.reg.MustRegister(m.overhead)
	m.reg.MustRegister(m.degraded, panics.Total)
	m.reload = newReloadGauges(m.reg)
	m.reg.MustRegister(m.decisions, m.admitSeconds, m.upstream, m.requests, m.capChanges, m.exactCalls, m.calibrations, m.ratio,
		&backendCollector{set: set}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// children caches a vector's children by their label values (at most three). WithLabelValues
// checks, hashes and looks up the values under the vector's lock on every call, several times per
// request; the label values come from small sets (routes, statuses, models, tenants, backends),
// and no vector here ever deletes a child, so a child once resolved stays the vector's.
type children[M any] struct {
	mu   sync.RWMutex
	m    map[[3]string]M
	n    int // the vector's label count
	with func(lvs ...string) M
}

// maxChildren bounds the cache (tenants come and go at run time); past it, WithLabelValues.
const maxChildren = 4096

// get is the child of the label values a, b, c (the first n of them).
func (c *children[M]) get(a, b, cc string) M {
	k := [3]string{a, b, cc}
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	lvs := append([]string(nil), k[:c.n]...) // a copy: k stays on the stack on the hit path
	v = c.with(lvs...)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[[3]string]M{}
	}
	if len(c.m) < maxChildren {
		c.m[k] = v
	}
	c.mu.Unlock()
	return v
}

// buildRevision is the VCS revision the binary was built from ("unknown" without VCS stamping),
// with "-dirty" when the tree had changes.
func buildRevision() string {
	rev, dirty := "unknown", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// maxModelLabels bounds the model label's values: the models backends advertise, up to this
// many, then everything is "other" (a client's "model" field, or an engine renaming itself in a
// loop, must not grow the series without bound).
const maxModelLabels = 32

// modelOther is the model label of every model no backend advertises.
const modelOther = "other"

// modelLabels turns a model name into a label value: a model some backend advertises (as read
// from its /v1/models), or "other".
type modelLabels struct {
	set  *backends.Set
	mu   sync.RWMutex
	seen map[string]bool
}

func (l *modelLabels) label(name string) string {
	if name == "" {
		return modelOther
	}
	l.mu.RLock()
	ok := l.seen[name]
	l.mu.RUnlock()
	if ok {
		return name
	}
	advertised := false
	for _, b := range l.set.All() {
		if c := b.Capacity(); c != nil && c.Model == name {
			advertised = true
			break
		}
	}
	if !advertised {
		return modelOther
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	if len(l.seen) >= maxModelLabels {
		return modelOther
	}
	l.seen[name] = true
	return name
}

// routeModel is the model a route's engines advertise (decode's on a PD pair: it writes the reply).
func routeModel(r *backends.Route) string {
	for _, b := range []*backends.Backend{r.Unified, r.Decode} {
		if b != nil {
			if c := b.Capacity(); c != nil {
				return c.Model
			}
		}
	}
	return ""
}

// upstreamCode is kvgate_upstream_responses_total's code: the HTTP status, or the transport
// error's kind by name.
func upstreamCode(status int, err error) string {
	if err == nil {
		return strconv.Itoa(status)
	}
	var ne net.Error
	var recErr tls.RecordHeaderError
	var alert tls.AlertError
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, apierr.ErrPrefillTimeout),
		errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, fasthttp.ErrConnectionClosed):
		return "reset"
	case errors.As(err, &recErr), errors.As(err, &alert), errors.As(err, &verify), errors.As(err, &unknownCA),
		errors.As(err, &hostname), errors.As(err, &invalid):
		return "tls"
	}
	return "other"
}

var (
	poolDesc = prometheus.NewDesc("kvgate_backend_pool_tokens",
		"The backend's KV pool as last read (max_total_num_tokens; the least of every DP rank's).", []string{"backend"}, nil)
	mrilDesc = prometheus.NewDesc("kvgate_backend_max_req_input_len_tokens",
		"The backend's max_req_input_len as last read (cut to min(context-1, pool-1)-5 when it claims more).", []string{"backend"}, nil)
	contextDesc = prometheus.NewDesc("kvgate_backend_context_tokens",
		"The backend's context (max_model_len) as last read.", []string{"backend"}, nil)
	mismatchDesc = prometheus.NewDesc("kvgate_backend_pool_below_context",
		"1 when a backend's KV pool is smaller than its advertised context, or than its own max_req_input_len (the incident's precondition).",
		[]string{"backend"}, nil)
	upDesc = prometheus.NewDesc("kvgate_backend_usable",
		"1 when the backend answers, reports its configured role and is not quarantined.", []string{"backend"}, nil)
	roleDesc = prometheus.NewDesc("kvgate_backend_role_mismatch",
		"1 when the backend's disaggregation_mode differs from its configured role.", []string{"backend"}, nil)
	quarantineDesc = prometheus.NewDesc("kvgate_backend_quarantined",
		"1 while the backend is quarantined.", []string{"backend"}, nil)
)

type backendCollector struct{ set *backends.Set }

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolDesc
	ch <- mrilDesc
	ch <- contextDesc
	ch <- mismatchDesc
	ch <- upDesc
	ch <- roleDesc
	ch <- quarantineDesc
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, b := range c.set.All() {
		if cp := b.Capacity(); cp != nil {
			ch <- prometheus.MustNewConstMetric(poolDesc, prometheus.GaugeValue, float64(cp.PoolTokens), b.Name)
			ch <- prometheus.MustNewConstMetric(mrilDesc, prometheus.GaugeValue, float64(cp.MaxReqInputLen), b.Name)
			ch <- prometheus.MustNewConstMetric(contextDesc, prometheus.GaugeValue, float64(cp.ContextLen), b.Name)
			ch <- prometheus.MustNewConstMetric(mismatchDesc, prometheus.GaugeValue, b01(cp.PoolAlarm()), b.Name)
			ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, b01(!b.RoleMatches()), b.Name)
		}
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, b01(c.set.Usable(b, now)), b.Name)
		ch <- prometheus.MustNewConstMetric(quarantineDesc, prometheus.GaugeValue, b01(b.QuarantinedUntil().After(now)), b.Name)
	}
}

func b01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
