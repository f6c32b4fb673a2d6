package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/state"
)

// This file wires a serving gateway for the binaries: kvgate serve, and the lab's demo.

// NewLogger writes JSON lines to stderr through a buffer flushed every 200 ms (and at exit):
// one write per access line would cost a system call per request on the hot path.
func NewLogger() *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	out := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(os.Stderr), Size: 256 << 10, FlushInterval: 200 * time.Millisecond}
	return zap.New(zapcore.NewCore(enc, out, zap.InfoLevel), zap.ErrorOutput(zapcore.AddSync(os.Stderr)))
}

// Start wires the backend set, its pollers and the gateway, and starts serving. With
// policy.strict it first waits for one reading of every backend and refuses to start when a pool
// is smaller than its context.
func Start(ctx context.Context, cfg *config.Config, log *zap.Logger) (*Gateway, net.Listener, error) {
	set, err := backends.New(cfg.Backends, backends.OptionsFrom(cfg), log)
	if err != nil {
		return nil, nil, err
	}
	st, err := state.Open(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	gw, err := New(cfg, set, st, log)
	if err != nil {
		return nil, nil, err
	}
	go set.Run(ctx)
	go gw.Run(ctx)
	if cfg.Policy.Strict {
		deadline := time.Now().Add(cfg.Capacity.Timeout*2 + time.Second)
		for !set.Ready() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		for _, b := range set.All() {
			if c := b.Capacity(); c != nil && c.PoolAlarm() {
				return nil, nil, fmt.Errorf("policy.strict: backend %s has a KV pool of %d tokens, smaller than its context of %d or its reported max_req_input_len of %d",
					b.Name, c.PoolTokens, c.ContextLen, max(c.MaxReqInputLen, c.ReportedMaxReqInputLen))
			}
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if addr := cfg.Server.MetricsListen; addr != "" {
		// /metrics alone, on its own address (a scraper's private network). It closes with ctx.
		mln, err := net.Listen("tcp", addr)
		if err != nil {
			_ = ln.Close()
			return nil, nil, fmt.Errorf("server.metrics_listen %s: %w", addr, err)
		}
		ms := &fasthttp.Server{Name: "kvgate", ReadTimeout: cfg.Server.ReadTimeout, IdleTimeout: cfg.Server.IdleTimeout,
			Handler: func(rc *fasthttp.RequestCtx) {
				if string(rc.Path()) != "/metrics" {
					rc.Error("not found", fasthttp.StatusNotFound)
					return
				}
				gw.ServeMetrics(rc)
			}}
		go func() { _ = ms.Serve(mln) }()
		go func() {
			<-ctx.Done()
			_ = ms.Shutdown()
		}()
	}
	go func() {
		if err := gw.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Error("server stopped", zap.Error(err))
		}
	}()
	return gw, ln, nil
}
