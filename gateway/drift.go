package gateway

// The drift monitor (issue 30): the count is kvgate's model of the prompt the engine renders, and
// every reply that reports its prompt tokens (usage.prompt_tokens, Anthropic's input_tokens,
// SGLang's meta_info.prompt_tokens: backends' one usage reader) checks that model. A reply whose
// engine counted more than the bound admission used is count drift: measured, counted, recorded
// as an incident; policy.count_drift.threshold of them for one model within
// policy.count_drift.window make that model's admission fail-closed (only exact counts admit;
// without one, 503 with Retry-After) on every replica, until an operator clears it.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/state"
)

// failClosedTTL is how long a fail-closed flag is stored: it lasts until an operator clears it
// (the store's flags need an expiry; ten years is none in practice).
const failClosedTTL = 10 * 365 * 24 * time.Hour

// failClosedRetryAfter is the Retry-After of a request refused while its model is fail-closed.
const failClosedRetryAfter = 30

// singleModelName names the one model of a gateway without models[] in flags and the admin API.
const singleModelName = "default"

type driftMonitor struct {
	g      *Gateway
	tokens *prometheus.HistogramVec // kvgate_count_drift_tokens{model,route,tier}
	total  *prometheus.CounterVec   // kvgate_count_drift_total{model,route,tier}
	// flags are the fail-closed models, shared through the state store like quarantine flags.
	flags  *state.Quarantines
	closed atomic.Pointer[map[string]time.Time] // what flags last applied: model → flag expiry

	mu     sync.Mutex
	recent map[string][]time.Time // per model: this replica's drifts within the window
}

func newDriftMonitor(g *Gateway, store state.Quarantine) *driftMonitor {
	d := &driftMonitor{g: g, recent: map[string][]time.Time{}}
	d.tokens = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_count_drift_tokens",
		Help:    "Replies whose engine reported its prompt tokens: the engine's count minus the bound admission used, by model, route and counting tier (above 0: the engine counted more).",
		Buckets: []float64{-4096, -1024, -256, -64, -16, -4, -1, 0, 1, 4, 16, 64, 256, 1024, 4096}}, []string{"model", "route", "tier"})
	d.total = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_count_drift_total",
		Help: "Replies whose engine counted more prompt tokens than the bound admission used (each one a count_drift incident), by model, route and counting tier."},
		[]string{"model", "route", "tier"})
	gauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_count_fail_closed_models",
		Help: "Models whose admission is fail-closed after count drift (exact counts only) until an operator clears them."},
		func() float64 { return float64(len(d.FailClosed())) })
	g.metrics.reg.MustRegister(d.tokens, d.total, gauge)
	empty := map[string]time.Time{}
	d.closed.Store(&empty)
	d.flags = state.NewQuarantines(store, d.apply)
	return d
}

// apply is the flags' routing hook: the models fail-closed now. A model no longer flagged (an
// operator cleared it, on any replica) starts its drift window afresh.
func (d *driftMonitor) apply(until map[string]time.Time) {
	old := *d.closed.Load()
	d.closed.Store(&until)
	d.mu.Lock()
	for m := range old {
		if _, still := until[m]; !still {
			delete(d.recent, m)
		}
	}
	d.mu.Unlock()
}

// flagName is model's name in flags and the admin API.
func flagName(model string) string {
	if model == "" {
		return singleModelName
	}
	return model
}

// failClosed says whether model's admission requires exact counts now.
func (d *driftMonitor) failClosed(model string) bool {
	m := *d.closed.Load()
	if len(m) == 0 {
		return false
	}
	_, ok := m[flagName(model)]
	return ok
}

// FailClosed lists the fail-closed models and since when.
func (d *driftMonitor) FailClosed() map[string]time.Time {
	out := map[string]time.Time{}
	for m, until := range *d.closed.Load() {
		out[m] = until.Add(-failClosedTTL)
	}
	return out
}

// observe compares the prompt tokens the engine reported for x's reply with the bound admission
// used (admitted: the decision's count for every prompt of the request).
func (d *driftMonitor) observe(x *exchange, engine, admitted int64) {
	if x.req == nil || admitted <= 0 {
		return
	}
	if x.kind == request.Generate && x.req.N > 1 {
		// SGLang's /generate answers sampling_params.n items, each reporting the prompt: the
		// reader sums them (OpenAI routes report a prompt once, whatever n).
		admitted *= int64(x.req.N)
	}
	route, tier := x.kind.Path(), string(x.decision.Tier)
	drift := engine - admitted
	d.tokens.WithLabelValues(x.model, route, tier).Observe(float64(drift))
	if drift <= 0 {
		return
	}
	d.total.WithLabelValues(x.model, route, tier).Inc()
	name := flagName(x.servedModel)
	tenant := tenantAnonymous
	if x.tenant != nil {
		tenant = x.tenant.Name
	}
	var backendNames []string
	if x.route != nil {
		backendNames = x.route.Backends
	}
	inc := state.Incident{Time: time.Now().UTC(), Kind: state.KindCountDrift, RequestID: x.rid, Requester: tenant,
		Backends: backendNames, Model: name, Route: route, Tier: tier, EngineTokens: int(engine), AdmittedTokens: int(admitted)}
	d.g.log.Error("count drift: the engine counted more prompt tokens than admission's bound",
		zap.String("request_id", x.rid), zap.String("tenant", tenant), zap.String("model", name), zap.String("route", route),
		zap.String("tier", tier), zap.Int64("engine_tokens", engine), zap.Int64("admitted_tokens", admitted))
	trip := d.note(name, inc.Time)
	d.g.goBackground("count_drift", func(ctx context.Context) {
		if err := d.g.state.Incidents.Record(ctx, inc); err != nil {
			d.g.log.Error("incident not recorded", zap.String("request_id", x.rid), zap.Error(err))
		}
		if trip {
			if err := d.flags.Share(ctx, name); err != nil {
				d.g.log.Warn("fail-closed flag not shared yet (kept locally, retried)", zap.String("model", name), zap.Error(err))
			}
		}
	})
}

// note counts a drift of model at now; true when it makes the model fail-closed (the flag is
// set here at once; the caller shares it).
func (d *driftMonitor) note(model string, now time.Time) bool {
	cd := d.g.pol().CountDrift
	d.mu.Lock()
	times := d.recent[model]
	keep := times[:0]
	for _, t := range times {
		if now.Sub(t) < cd.Window {
			keep = append(keep, t)
		}
	}
	keep = append(keep, now)
	d.recent[model] = keep
	n := len(keep)
	d.mu.Unlock()
	if n < cd.Threshold || d.failClosed(model) {
		return false
	}
	d.g.log.Error("count drift: the model's admission is fail-closed (exact counts only) until an operator clears it",
		zap.String("model", model), zap.Int("drifts", n), zap.Duration("window", cd.Window))
	d.flags.Mark(model, failClosedTTL, fmt.Sprintf("count drift: %d replies in %s", n, cd.Window))
	return true
}

// goBackground runs work off the request path with a bounded context (the store queues while
// Redis is away); once the gateway is shutting down, on the caller's goroutine so it is not lost.
func (g *Gateway) goBackground(name string, work func(ctx context.Context)) {
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		work(ctx)
	}
	g.bgMu.Lock()
	if g.bgClosed {
		g.bgMu.Unlock()
		run()
		return
	}
	g.bg.Add(1)
	g.bgMu.Unlock()
	go func() {
		defer g.bg.Done()
		defer panics.Recover(g.log, name)
		run()
	}()
}
