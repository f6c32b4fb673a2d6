package gateway

import (
	"fmt"
	"reflect"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tenants"
	"github.com/kvgate/kvgate/tokenize"
)

// Reload applies a new, validated configuration to the running gateway: backends (and
// discovery), models, tenants, the admission policy and the tokenizers. Requests in flight keep
// what they were admitted with (their tenant, route and backends) and are not touched. Other
// settings (listen addresses, state, canary, limits, upstream, server) need a restart: a change
// there is logged and not applied. On an error nothing changes.
func (g *Gateway) Reload(cfg *config.Config) error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	// Everything that can fail is built first.
	models, err := newModelTable(cfg, g.backends, tokenize.NewSafetyRatio(cfg.Tokenizer.SafetyRatio, cfg.Tokenizer.SafetyRatioMax), g.metrics, g.log)
	if err != nil {
		return err
	}
	if err := g.backends.Reconfigure(cfg.Backends, cfg.Discovery); err != nil {
		return fmt.Errorf("backends: %w", err)
	}
	base := tenants.FromConfig(cfg.Tenants)
	for _, t := range base {
		g.watch.AddTenant(t.Name) // a new config tenant's markers are injected and detected at once
	}
	g.tenants.SetBase(base)
	g.models.Store(models)
	g.policy.Store(&cfg.Policy)
	// Engines already calibrated keep their calibration only in the old table: recalibrate all.
	for _, b := range g.backends.All() {
		if b.Capacity() != nil {
			go models.counter(b.Model).Calibrate(b)
		}
	}
	if fixed := restartOnly(g.cfg, cfg); len(fixed) > 0 {
		g.log.Warn("reload: these settings changed and need a restart; the running values are kept", zap.Strings("settings", fixed))
	}
	g.log.Info("configuration reloaded", zap.Int("backends", len(cfg.Backends)), zap.Int("models", len(cfg.ModelNames())),
		zap.Int("tenants", len(cfg.Tenants)))
	return nil
}

// restartOnly names the top-level settings that differ between old and cur and that Reload does
// not apply.
func restartOnly(old, cur *config.Config) []string {
	reloaded := map[string]bool{"backends": true, "models": true, "tenants": true, "policy": true, "tokenizer": true, "discovery": true}
	var out []string
	ov, cv := reflect.ValueOf(old).Elem(), reflect.ValueOf(cur).Elem()
	for i := 0; i < ov.NumField(); i++ {
		name := ov.Type().Field(i).Tag.Get("yaml")
		if reloaded[name] {
			continue
		}
		if !reflect.DeepEqual(ov.Field(i).Interface(), cv.Field(i).Interface()) {
			out = append(out, name)
		}
	}
	return out
}
