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

func newLogger() *zap.Logger {
	zc := zap.NewProductionConfig()
	zc.Sampling = nil // every access line counts
	log, err := zc.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
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
			if c := b.Capacity(); c != nil && c.PoolBelowContext() {
				return nil, nil, fmt.Errorf("policy.strict: backend %s has a KV pool of %d tokens, smaller than its context of %d", b.Name, c.PoolTokens, c.ContextLen)
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
