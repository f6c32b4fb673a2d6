package gateway

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
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

// Exact implements policy.ExactCounter. The timeout covers the wait for a slot and the call, and
// is only set up here: most requests never need an exact count.
func (e *exactCounter) Exact(ctx context.Context, text string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	select {
	case e.slots <- struct{}{}:
		defer func() { <-e.slots }()
	case <-ctx.Done():
		e.count("saturated")
		return 0, errSaturated
	}
	now := time.Now()
	var lastErr error = backends.ErrNoBackend
	for _, b := range e.set.All() {
		if !e.set.Usable(b, now) {
			continue
		}
		n, err := b.Tokenize(ctx, text, e.timeout)
		if err == nil {
			e.count("ok")
			return n, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	e.count("error")
	return 0, lastErr
}

func (e *exactCounter) count(result string) {
	if e.metrics != nil {
		e.metrics.exactCalls.WithLabelValues(result).Inc()
	}
}

// calibrationText mixes prose, code, numbers and CJK, the kinds of text whose token density
// differs most between tokenizers.
const calibrationText = `The quick brown fox jumps over the lazy dog while the committee reviews
quarterly infrastructure recommendations, internationalization requirements and throughput.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) { if err := s.db.Ping(); err != nil { return } }
for i in range(1024): total += values[i] * 0.5  # 3.14159 2718281828 0xDEADBEEF 2026-12-02T14:33:22Z
人工智能正在改变我们处理信息的方式，缓存中的数据必须被安全地隔离。
Antidisestablishmentarianism, floccinaucinihilipilification and pseudopseudohypoparathyroidism.
`

// calibrate compares the engine's exact count of a fixed text with the local estimate. An engine
// whose tokenizer counts more than estimate × ratio makes estimates unsafe for admission (they
// may still refuse); the ratio also learns from it, up to its cap. It runs on the poller's
// goroutine, before the backend counts as read, so no request is decided before it.
func (g *Gateway) calibrate(b *backends.Backend) {
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Tokenizer.ExactTimeout)
		defer cancel()
		engine, err := b.Tokenize(ctx, calibrationText, g.cfg.Tokenizer.ExactTimeout)
		if err != nil {
			g.log.Info("tokenizer calibration skipped: engine has no usable /tokenize", zap.String("backend", b.Name), zap.Error(err))
			return
		}
		local, _ := g.enc.Count(calibrationText, -1)
		local += specialTokenAllowance // the engine's count includes its special tokens
		g.ratio.Observe(local, engine)
		if float64(engine) > float64(local)*g.cfg.Tokenizer.SafetyRatio {
			if !g.distrustEstimate.Swap(true) {
				g.log.Warn("engine tokenizer counts more than estimate × safety_ratio: estimates will not admit prompts the byte bound cannot; borderline prompts are counted by the engine",
					zap.String("backend", b.Name), zap.Int("engine_count", engine), zap.Int("estimate", local),
					zap.Float64("safety_ratio", g.cfg.Tokenizer.SafetyRatio))
			}
		}
	}()
}
