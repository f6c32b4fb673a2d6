package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/panics"
)

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

	canaryInjected prometheus.Counter
	canarySkipped  *prometheus.CounterVec
	incidents      *prometheus.CounterVec
	degraded       prometheus.GaugeFunc

	// upstream.max_buffered_bytes (budget.go): replies refused because it was spent
	repliesOverBudget prometheus.Counter

	// kvgate overhead (overhead.go): the vector and its three children, resolved once.
	overhead                                      *prometheus.HistogramVec
	overheadBefore, overheadAfter, overheadStream prometheus.Observer
}

func newMetrics(set *backends.Set, ratio func() float64, degraded func() bool) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_admission_decisions_total",
		Help: "Admission decisions by outcome, reason and the counting tier that decided."}, []string{"decision", "reason", "tier"})
	m.admitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvgate_admission_seconds",
		Help: "Time to parse, count and decide one request.", Buckets: prometheus.ExponentialBuckets(5e-6, 4, 10)})
	m.upstream = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_upstream_responses_total",
		Help: "Engine responses by backend and status code (0: transport error)."}, []string{"backend", "code"})
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
	m.canaryInjected = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_canary_injected_total",
		Help: "Requests that carried the tenant's canary marker."})
	m.canarySkipped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_canary_skipped_total",
		Help: "Requests without a marker, by reason (input_ids, opt_out)."}, []string{"reason"})
	m.incidents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_canary_incidents_total",
		Help: "Foreign markers seen in replies: leak (cut, quarantined) or echo (the requester's own prompt had it). A rising echo rate is an alarm too."}, []string{"kind"})
	m.degraded = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_state_degraded",
		Help: "1 while the shared store (Redis) is unreachable and incident writes queue in memory."}, func() float64 { return b01(degraded()) })
	m.overhead = newOverheadHistogram() // kvgate overhead
	m.overheadBefore = m.overhead.WithLabelValues(phaseBeforeUpstream)
	m.overheadAfter = m.overhead.WithLabelValues(phaseAfterHeaders)
	m.overheadStream = m.overhead.WithLabelValues(phaseStreamRead)
	m.reg.MustRegister(m.overhead)
	m.reg.MustRegister(m.canaryInjected, m.canarySkipped, m.incidents, m.degraded, panics.Total)
	m.reg.MustRegister(m.decisions, m.admitSeconds, m.upstream, m.requests, m.capChanges, m.exactCalls, m.calibrations, m.ratio,
		&backendCollector{set: set}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var (
	capDesc = prometheus.NewDesc("kvgate_backend_capacity_tokens",
		"Backend limits as last read: pool (max_total_num_tokens), max_req_input_len, context (max_model_len).",
		[]string{"backend", "role", "kind"}, nil)
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
	ch <- capDesc
	ch <- mismatchDesc
	ch <- upDesc
	ch <- roleDesc
	ch <- quarantineDesc
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, b := range c.set.All() {
		if cp := b.Capacity(); cp != nil {
			ch <- prometheus.MustNewConstMetric(capDesc, prometheus.GaugeValue, float64(cp.PoolTokens), b.Name, string(b.Role), "pool")
			ch <- prometheus.MustNewConstMetric(capDesc, prometheus.GaugeValue, float64(cp.MaxReqInputLen), b.Name, string(b.Role), "max_req_input_len")
			ch <- prometheus.MustNewConstMetric(capDesc, prometheus.GaugeValue, float64(cp.ContextLen), b.Name, string(b.Role), "context")
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
