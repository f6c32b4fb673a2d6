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
	"github.com/kvgate/kvgate/telemetry"
)

// This file wires a serving gateway for the binaries: kvgate serve, and the lab's demo.

// NewLogger writes JSON lines to stderr through a buffer flushed every 200 ms (and at exit):
// one write per access line would cost a system call per request on the hot path. "ts" is an
// ISO-8601 time in UTC with milliseconds. The standard library's log (which libraries may use)
// is redirected into it as warnings; go-redis's logger is set by state.Open, fasthttp's by New.
func NewLogger() *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = EncodeTime
	enc := zapcore.NewJSONEncoder(ec)
	out := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(os.Stderr), Size: 256 << 10, FlushInterval: 200 * time.Millisecond}
	log := zap.New(zapcore.NewCore(enc, out, zap.InfoLevel), zap.ErrorOutput(zapcore.AddSync(os.Stderr)))
	if _, err := zap.RedirectStdLogAt(log.With(zap.String("component", "stdlog")), zap.WarnLevel); err != nil {
		log.Warn("standard library log not redirected", zap.Error(err))
	}
	return log
}

// EncodeTime writes a log line's time as ISO 8601 in UTC with milliseconds
// (2026-12-03T16:00:24.123Z).
func EncodeTime(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	enc.AppendString(t.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}

// fasthttpLogger sends fasthttp's own messages (connection errors it cannot answer) to zap.
type fasthttpLogger struct{ log *zap.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Warn("http server", zap.String("message", fmt.Sprintf(format, args...)))
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
	tr, err := telemetry.Setup(ctx, os.LookupEnv, Version) // off unless OTEL_* variables ask for it
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: %w", err)
	}
	if tr != nil {
		gw.SetTracing(tr)
		log.Info("tracing: spans exported over OTLP/HTTP as the OTEL_* variables say")
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
			Logger: fasthttpLogger{log.With(zap.String("component", "fasthttp"))},
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
