// Package admission counts a request's prompts the way the engines of a path will and decides,
// path by path (least loaded first), whether the request fits: the three counting tiers (the
// byte bound, the local estimate with its safety ratio, the engine's own /tokenize), and each
// engine's tokenizer calibration, which says where an estimate may admit. The rule itself is
// policy's (pure); this package owns the counting state. It knows nothing of HTTP.
package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/tokenize"
)

// exactCounter asks an engine's /tokenize for gray-zone prompts, with bounded concurrency so a
// burst of borderline prompts cannot flood the engines; when every slot stays busy for the
// timeout, the caller falls back to the estimate.
type exactCounter struct {
	set     *backends.Set
	slots   chan struct{}
	timeout time.Duration
	calls   *prometheus.CounterVec // by result; nil: not counted
}

var errSaturated = errors.New("exact counting saturated")

func newExactCounter(set *backends.Set, concurrency int, timeout time.Duration) *exactCounter {
	return &exactCounter{set: set, slots: make(chan struct{}, max(concurrency, 1)), timeout: timeout}
}

// countOn asks backend b for the exact count of text. The timeout covers the wait for a slot and
// the call, and is only set up here: most requests never need an exact count. Only an engine on
// the path that will serve counts: another engine's tokenizer may count differently.
func (e *exactCounter) countOn(ctx context.Context, b *backends.Backend, text string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	select {
	case e.slots <- struct{}{}:
		defer func() { <-e.slots }()
	case <-ctx.Done():
		e.count("saturated")
		return 0, errSaturated
	}
	n, err := b.Tokenize(ctx, text, e.timeout)
	if err != nil {
		e.count("error")
		return 0, err
	}
	e.count("ok")
	return n, nil
}

func (e *exactCounter) count(result string) {
	if e.calls != nil {
		e.calls.WithLabelValues(result).Inc()
	}
}

// calibration is what comparing one engine's tokenizer with the local estimate found.
type calibration struct {
	// fingerprint is the engine's counts of the calibration samples: engines with equal
	// fingerprints share a tokenizer, so one exact count serves them all.
	fingerprint string
	// distrust: on some kind of text the engine counts more than estimate × safety_ratio, so an
	// estimate may refuse prompts for paths through it but never admit them.
	distrust bool
	worst    float64
	kind     string
	// floor is the smallest plausible ratio of the engine's exact count to the local estimate:
	// half the smallest ratio seen on the samples. A later count below it contradicts what the
	// engine's tokenizer showed, and is not believed.
	floor float64
}

// calibRetry is an engine whose calibration failed: when to try again, and whether an attempt
// is running now.
type calibRetry struct {
	failures int
	next     time.Time
	running  bool
}

// calibrationFloorSlack divides the smallest sample ratio into the floor: a prompt unlike every
// sample may count lower than any of them, but not by half.
const calibrationFloorSlack = 2

// calibrationMinShare: an engine's count of a sample below a 1/8 of the local estimate is no
// real tokenizer (vocabularies differ by tens of percent, not eightfold): the answer is a lie.
const calibrationMinShare = 8

func (g *Counter) calibrationOf(b *backends.Backend) *calibration {
	if b == nil {
		return nil
	}
	g.calibMu.RLock()
	defer g.calibMu.RUnlock()
	return g.calib[b.Name]
}

// RetryCalibration starts a new calibration attempt for b, in the background, when b has none,
// its last attempt failed, the next is due and none is running. Called on every successful poll,
// so attempts follow the poll interval, backing off up to tokenizer.calibration_retry_max; off the
// poller's goroutine, so a /tokenize that hangs cannot make the capacity reading stale.
func (g *Counter) RetryCalibration(b *backends.Backend, now time.Time) {
	if g.o.LocalExact {
		return
	}
	g.calibMu.Lock()
	r := g.calibRetry[b.Name]
	due := g.calib[b.Name] == nil && r != nil && !r.running && !now.Before(r.next)
	if due {
		r.running = true
	}
	g.calibMu.Unlock()
	if !due {
		return
	}
	go func() {
		defer panics.Recover(g.log, "calibration")
		defer func() {
			g.calibMu.Lock()
			if r := g.calibRetry[b.Name]; r != nil {
				r.running = false
			}
			g.calibMu.Unlock()
		}()
		g.Calibrate(b)
	}()
}

// Calibrate compares the engine's exact count of each calibration sample with the local
// estimate; the worst ratio decides. An engine whose tokenizer counts more than estimate × ratio
// on any kind of text makes estimates unsafe for admission on paths through it (they may still
// refuse); the ratio also learns from it, up to its cap. It runs on the poller's goroutine,
// before the backend counts as read, so no request is decided before it. An engine that cannot
// be calibrated (its /tokenize fails, or answers what no tokenizer could) is not trusted: its
// paths get refuse-only estimates until a retry succeeds.
// Calibrate compares b's tokenizer with the local estimate now (on a capacity change).
func (g *Counter) Calibrate(b *backends.Backend) {
	if g.o.LocalExact {
		return // the local count is the engine's own: nothing to compare, no engine to ask
	}
	// Only the latest attempt may store its result: a background retry that started before a
	// capacity change (perhaps another tokenizer) must not overwrite what came after it.
	g.calibMu.Lock()
	g.calibGen[b.Name]++
	gen := g.calibGen[b.Name]
	g.calibMu.Unlock()
	var fp strings.Builder
	c := &calibration{floor: math.Inf(1)}
	worstLocal, worstEngine := 0, 0
	for _, s := range tokenize.CalibrationSamples {
		ctx, cancel := context.WithTimeout(context.Background(), g.o.ExactTimeout)
		engine, err := b.Tokenize(ctx, s.Text, g.o.ExactTimeout)
		cancel()
		local, _ := g.Encoder.Count(s.Text, -1)
		local += specialTokenAllowance // the engine's count includes its special tokens
		if err == nil && (engine < 1 || engine > len(s.Text)+specialTokenAllowance || engine*calibrationMinShare < local) {
			err = fmt.Errorf("implausible count %d of a %d-byte %s sample (estimate %d)", engine, len(s.Text), s.Kind, local)
		}
		if err != nil {
			g.calibrationFailed(b, gen, err)
			return
		}
		fmt.Fprintf(&fp, "%d,", engine)
		r := float64(engine) / float64(local)
		if r > c.worst {
			c.worst, c.kind, worstLocal, worstEngine = r, s.Kind, local, engine
		}
		c.floor = min(c.floor, r/calibrationFloorSlack)
	}
	c.fingerprint = fp.String()
	g.o.Ratio.Observe(worstLocal, worstEngine)
	c.distrust = c.worst > g.o.SafetyRatio
	g.calibMu.Lock()
	if g.calibGen[b.Name] != gen {
		g.calibMu.Unlock()
		return
	}
	old := g.calib[b.Name]
	g.calib[b.Name] = c
	retried := g.calibRetry[b.Name]
	delete(g.calibRetry, b.Name)
	g.calibMu.Unlock()
	g.calibrated(b.Name, "ok")
	if retried != nil {
		g.log.Info("engine tokenizer calibrated after failed attempts: estimates for its paths follow calibration again",
			zap.String("backend", b.Name), zap.Int("failed_attempts", retried.failures))
	}
	if c.distrust && (old == nil || !old.distrust) {
		g.log.Warn("engine tokenizer counts more than estimate × safety_ratio: estimates will not admit prompts for paths through it that the byte bound cannot; borderline prompts are counted by the engine",
			zap.String("backend", b.Name), zap.String("text_kind", c.kind), zap.Int("engine_count", worstEngine),
			zap.Int("estimate", worstLocal), zap.Float64("safety_ratio", g.o.SafetyRatio))
	}
}

// calibrationFailed forgets b's calibration (a failure after a capacity change may mean another
// tokenizer) and schedules the next attempt: one poll interval after the first failure,
// doubling, capped at tokenizer.calibration_retry_max.
func (g *Counter) calibrationFailed(b *backends.Backend, gen uint64, err error) {
	g.calibMu.Lock()
	if g.calibGen[b.Name] != gen {
		g.calibMu.Unlock()
		return
	}
	delete(g.calib, b.Name)
	r := g.calibRetry[b.Name]
	if r == nil {
		r = &calibRetry{}
		g.calibRetry[b.Name] = r
	}
	r.failures++
	delay := g.o.CalibrationRetryMax
	if shift := r.failures - 1; shift < 30 {
		delay = min(delay, g.o.PollInterval<<shift)
	}
	r.next = time.Now().Add(delay)
	failures := r.failures
	g.calibMu.Unlock()
	g.calibrated(b.Name, "failed")
	if failures == 1 {
		g.log.Warn("engine tokenizer could not be calibrated: estimates for paths through it are refuse-only, every borderline prompt needs its exact count (503 count_unavailable without one); retrying with backoff",
			zap.String("backend", b.Name), zap.Error(err), zap.Duration("next_attempt_in", delay))
	}
}

// pathCounter is policy.ExactCounter for one request on one path: the engines that will serve
// count (the unified backend; a PD pair's prefill, and its decode too when calibration says the
// two tokenize differently), and the largest count is the prompt's. Counts are kept per
// tokenizer for the request, so trying another path with the same tokenizer asks no engine again.
type pathCounter struct {
	g      *Counter
	route  *backends.Route
	prompt int               // index of the prompt being decided
	est    *cachingEstimator // its estimate (counted before any exact count is asked)
	cache  map[string]int    // tokenizer key + prompt index → count
}

// errImplausible: an engine's exact count is below what its calibration (or, without one, any
// tokenizer) allows.
var errImplausible = errors.New("exact count below what the engine's tokenizer allows")

var _ policy.ExactCounter = (*pathCounter)(nil)

func (p *pathCounter) Exact(ctx context.Context, text string) (int, error) {
	first := p.route.Unified
	if first == nil {
		first = p.route.Prefill
	}
	counters := []*backends.Backend{first}
	if d := p.route.Decode; d != nil {
		// Only a calibration that shows the same tokenizer lets the prefill count for the decode.
		fc, dc := p.g.calibrationOf(first), p.g.calibrationOf(d)
		if dc == nil || fc == nil || fc.fingerprint != dc.fingerprint {
			counters = append(counters, d)
		}
	}
	best := 0
	for _, b := range counters {
		key := "backend:" + b.Name
		if c := p.g.calibrationOf(b); c != nil {
			key = "tokenizer:" + c.fingerprint
		}
		key += "#" + strconv.Itoa(p.prompt)
		n, ok := p.cache[key]
		if !ok {
			var err error
			if n, err = p.g.exact.countOn(ctx, b, text); err != nil {
				return 0, err
			}
			// Each engine's count is checked against its own calibration (the largest count
			// decides, so one engine answering low must not hide behind another's); an engine
			// not calibrated gets the bound calibration itself applies.
			floor := 1.0 / calibrationMinShare
			if c := p.g.calibrationOf(b); c != nil {
				floor = c.floor
			}
			if n < 1 || p.est != nil && p.est.done && float64(n) < floor*float64(p.est.n) {
				p.g.exact.count("implausible")
				return 0, errImplausible
			}
			p.cache[key] = n
		}
		best = max(best, n)
	}
	return best, nil
}

// distrusted says whether an estimate may not admit on r: some engine on it was calibrated to
// count more than estimate × safety_ratio, or could not be calibrated at all (unknown is not
// trusted).
func (g *Counter) distrusted(r *backends.Route) bool {
	for _, b := range r.All() {
		if c := g.calibrationOf(b); c == nil || c.distrust {
			return true
		}
	}
	return false
}

// Options configure a Counter.
type Options struct {
	Encoder tokenize.Encoder
	Ratio   *tokenize.SafetyRatio
	// Set is where exact counts are asked; ExactConcurrency bounds the calls in flight and
	// ExactTimeout each one (the wait for a slot included).
	Set                 *backends.Set
	ExactConcurrency    int
	ExactTimeout        time.Duration
	SafetyRatio         float64       // tokenizer.safety_ratio: calibration distrusts engines over it
	CalibrationRetryMax time.Duration // the longest wait between attempts to calibrate an engine
	PollInterval        time.Duration // the first wait after a failed calibration
	Log                 *zap.Logger
	// LocalExact says Encoder is the served model's own tokenizer counting prompts rendered with
	// its own chat template (tokenizer.hf_dir): counts are exact, so no engine is calibrated or
	// asked, and no ratio or allowance applies.
	LocalExact bool
	// LocalTextOverhead is what the local tokenizer adds to a text prompt that no chat template
	// rendered (its post-processor's special tokens).
	LocalTextOverhead int
	// ExactCalls and Calibrations, when set, count /tokenize calls by result and calibrations
	// by backend and result.
	ExactCalls, Calibrations *prometheus.CounterVec
}

// Counter is the counting state of one gateway: calibrations per engine, the exact counter.
type Counter struct {
	o   Options
	log *zap.Logger
	// Encoder is the local estimate's tokenizer (replaceable before serving).
	Encoder tokenize.Encoder
	exact   *exactCounter // nil: no engine is asked (the gray zone cannot admit)

	calibMu    sync.RWMutex
	calib      map[string]*calibration // per backend: what calibration found
	calibRetry map[string]*calibRetry  // engines whose calibration failed, until one succeeds
	calibGen   map[string]uint64       // attempts started per engine: only the latest stores
}

// New builds a Counter.
func New(o Options) *Counter {
	c := &Counter{o: o, log: o.Log, Encoder: o.Encoder, calib: map[string]*calibration{},
		calibRetry: map[string]*calibRetry{}, calibGen: map[string]uint64{}}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if o.Set != nil && !o.LocalExact {
		c.exact = newExactCounter(o.Set, o.ExactConcurrency, o.ExactTimeout)
		c.exact.calls = o.ExactCalls
	}
	return c
}

// WithoutExact stops asking engines for exact counts: borderline prompts are then undecided.
func (g *Counter) WithoutExact() { g.exact = nil }

// Ratio is the safety ratio applied to estimates now.
func (g *Counter) Ratio() float64 { return g.o.Ratio.Get() }

// Learn raises the safety ratio from a prompt an engine counted as reported after it was
// estimated as estimate.
func (g *Counter) Learn(estimate, reported int) { g.o.Ratio.Observe(estimate, reported) }

func (g *Counter) calibrated(backend, result string) {
	if g.o.Calibrations != nil {
		g.o.Calibrations.WithLabelValues(backend, result).Inc()
	}
}
