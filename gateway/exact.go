package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
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
	metrics *metrics
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
	if e.metrics != nil {
		e.metrics.exactCalls.WithLabelValues(result).Inc()
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
}

func (g *Gateway) calibrationOf(b *backends.Backend) *calibration {
	if b == nil {
		return nil
	}
	g.calibMu.RLock()
	defer g.calibMu.RUnlock()
	return g.calib[b.Name]
}

// calibrate compares the engine's exact count of each calibration sample with the local
// estimate; the worst ratio decides. An engine whose tokenizer counts more than estimate × ratio
// on any kind of text makes estimates unsafe for admission on paths through it (they may still
// refuse); the ratio also learns from it, up to its cap. It runs on the poller's goroutine,
// before the backend counts as read, so no request is decided before it.
func (g *Gateway) calibrate(b *backends.Backend) {
	var fp strings.Builder
	c := &calibration{}
	worstLocal, worstEngine := 0, 0
	for _, s := range tokenize.CalibrationSamples {
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Tokenizer.ExactTimeout)
		engine, err := b.Tokenize(ctx, s.Text, g.cfg.Tokenizer.ExactTimeout)
		cancel()
		if err != nil {
			g.log.Info("tokenizer calibration skipped: engine has no usable /tokenize", zap.String("backend", b.Name), zap.Error(err))
			g.calibMu.Lock()
			delete(g.calib, b.Name)
			g.calibMu.Unlock()
			return
		}
		local, _ := g.enc.Count(s.Text, -1)
		local += specialTokenAllowance // the engine's count includes its special tokens
		fmt.Fprintf(&fp, "%d,", engine)
		if r := float64(engine) / float64(local); r > c.worst {
			c.worst, c.kind, worstLocal, worstEngine = r, s.Kind, local, engine
		}
	}
	c.fingerprint = fp.String()
	g.ratio.Observe(worstLocal, worstEngine)
	c.distrust = c.worst > g.cfg.Tokenizer.SafetyRatio
	g.calibMu.Lock()
	old := g.calib[b.Name]
	g.calib[b.Name] = c
	g.calibMu.Unlock()
	if c.distrust && (old == nil || !old.distrust) {
		g.log.Warn("engine tokenizer counts more than estimate × safety_ratio: estimates will not admit prompts for paths through it that the byte bound cannot; borderline prompts are counted by the engine",
			zap.String("backend", b.Name), zap.String("text_kind", c.kind), zap.Int("engine_count", worstEngine),
			zap.Int("estimate", worstLocal), zap.Float64("safety_ratio", g.cfg.Tokenizer.SafetyRatio))
	}
}

// pathCounter is policy.ExactCounter for one request on one path: the engines that will serve
// count (the unified backend; a PD pair's prefill, and its decode too when calibration says the
// two tokenize differently), and the largest count is the prompt's. Counts are kept per
// tokenizer for the request, so trying another path with the same tokenizer asks no engine again.
type pathCounter struct {
	g      *Gateway
	route  *backends.Route
	prompt int            // index of the prompt being decided
	cache  map[string]int // tokenizer key + prompt index → count
}

var _ policy.ExactCounter = (*pathCounter)(nil)

func (p *pathCounter) Exact(ctx context.Context, text string) (int, error) {
	first := p.route.Unified
	if first == nil {
		first = p.route.Prefill
	}
	counters := []*backends.Backend{first}
	if d := p.route.Decode; d != nil {
		fc, dc := p.g.calibrationOf(first), p.g.calibrationOf(d)
		if dc != nil && (fc == nil || fc.fingerprint != dc.fingerprint) {
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
			p.cache[key] = n
		}
		best = max(best, n)
	}
	return best, nil
}

// distrusted says whether an estimate may not admit on r: some engine on it was calibrated to
// count more than estimate × safety_ratio.
func (g *Gateway) distrusted(r *backends.Route) bool {
	for _, b := range []*backends.Backend{r.Unified, r.Prefill, r.Decode} {
		if c := g.calibrationOf(b); c != nil && c.distrust {
			return true
		}
	}
	return false
}
