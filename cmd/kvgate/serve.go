package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

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
	log := gateway.NewLogger()
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	gw, ln, err := gateway.Start(ctx, cfg, log)
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	log.Info("kvgate serving", zap.String("listen", ln.Addr().String()), zap.String("mode", string(cfg.Policy.Mode)),
		zap.Int("backends", len(cfg.Backends)), zap.Int("tenants", len(cfg.Tenants)))
	<-ctx.Done()
	return drain(gw, log)
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
