package gateway

import (
	"fmt"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"

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
func (g *Gateway) Reload(cfg *config.Config) (err error) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	defer func() { g.metrics.reload.record(err == nil) }()
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

// ReloadFailed records a reload that never reached Reload (the file did not load or validate):
// kvgate_config_last_reload_successful drops to 0 until a reload succeeds.
func (g *Gateway) ReloadFailed() { g.metrics.reload.record(false) }

// reloadGauges say whether the last reload took, and when the running configuration was
// loaded, as Prometheus's own config_last_reload_* do: an alert on == 0 catches a bad file
// pushed to a config map that every replica silently kept ignoring.
type reloadGauges struct {
	ok, at prometheus.Gauge
}

func newReloadGauges(reg *prometheus.Registry) reloadGauges {
	r := reloadGauges{
		ok: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_config_last_reload_successful",
			Help: "1 when the last configuration reload (SIGHUP or reload.watch) was applied, or none was tried; 0 when it failed and the previous configuration runs."}),
		at: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_config_last_reload_success_timestamp_seconds",
			Help: "Unix time the running configuration was loaded: the start, or the last reload applied."}),
	}
	r.ok.Set(1)
	r.at.SetToCurrentTime()
	reg.MustRegister(r.ok, r.at)
	return r
}

func (r reloadGauges) record(ok bool) {
	if ok {
		r.ok.Set(1)
		r.at.SetToCurrentTime()
		return
	}
	r.ok.Set(0)
}
