package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
)

func runServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("config", "kvgate.yaml", "path of the YAML configuration")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := config.Load(*path, os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvgate serve:", err)
		return 2
	}
	log := newLogger()
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	gw, ln, err := startGateway(ctx, cfg, log)
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	log.Info("kvgate serving", zap.String("listen", ln.Addr().String()), zap.String("mode", string(cfg.Policy.Mode)),
		zap.Int("backends", len(cfg.Backends)), zap.Int("tenants", len(cfg.Tenants)))
	<-ctx.Done()
	return drain(gw, log)
}

// newLogger writes JSON lines to stderr through a buffer flushed every 200 ms (and at exit):
// one write per access line would cost a system call per request on the hot path.
func newLogger() *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	out := &zapcore.BufferedWriteSyncer{WS: zapcore.AddSync(os.Stderr), Size: 256 << 10, FlushInterval: 200 * time.Millisecond}
	return zap.New(zapcore.NewCore(enc, out, zap.InfoLevel), zap.ErrorOutput(zapcore.AddSync(os.Stderr)))
}

// startGateway wires the backend set, its pollers and the gateway, and starts serving. With
// policy.strict it first waits for one reading of every backend and refuses to start when a pool
// is smaller than its context.
func startGateway(ctx context.Context, cfg *config.Config, log *zap.Logger) (*gateway.Gateway, net.Listener, error) {
	set, err := backends.New(cfg.Backends, backends.OptionsFrom(cfg), log)
	if err != nil {
		return nil, nil, err
	}
	st, err := gateway.OpenState(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	gw, err := gateway.New(cfg, set, st, log)
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
	go func() {
		if err := gw.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
			log.Error("server stopped", zap.Error(err))
		}
	}()
	return gw, ln, nil
}

// drain stops accepting and lets requests in flight finish, for at most 30 s.
func drain(gw *gateway.Gateway, log *zap.Logger) int {
	log.Info("draining")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := gw.Shutdown(ctx); err != nil {
		log.Warn("drain incomplete", zap.Error(err))
		return 1
	}
	log.Info("stopped")
	return 0
}
