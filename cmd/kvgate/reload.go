package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
)

// reloader re-reads the configuration file on SIGHUP (and, with reload.watch, when the file
// changes) and applies it to the running gateway; an invalid file is logged and the running
// configuration kept. running is the configuration the gateway started with: each reload logs
// what changed from the last one applied.
func reloader(ctx context.Context, path string, gw *gateway.Gateway, running *config.Config, watch bool, log *zap.Logger) {
	r := &reloads{path: path, gw: gw, running: running, log: log}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				r.reload("SIGHUP")
			}
		}
	}()
	if watch {
		watchFile(ctx, path, r, log)
	}
}

// reloads holds the configuration last applied; mu orders a SIGHUP and a file change.
type reloads struct {
	path    string
	gw      *gateway.Gateway
	log     *zap.Logger
	mu      sync.Mutex
	running *config.Config
}

func (r *reloads) reload(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, err := config.Load(r.path, os.Environ())
	if err != nil {
		r.gw.ReloadFailed()
		r.log.Error("reload: the configuration file is invalid; the running configuration is kept", zap.String("trigger", why), zap.Error(err))
		return
	}
	changed := config.Diff(r.running, cfg)
	if err := r.gw.Reload(cfg); err != nil {
		r.log.Error("reload: not applied; the running configuration is kept", zap.String("trigger", why), zap.Strings("changes_not_applied", changed), zap.Error(err))
		return
	}
	r.running = cfg
	// Secrets are never in the lines (config.Diff): a changed one reads "changed (secret)".
	r.log.Info("reload: configuration changes", zap.String("trigger", why), zap.Int("count", len(changed)), zap.Strings("changed", changed))
}

// watchFile reloads when path is written, created or renamed into place: its directory is
// watched, since editors and config-map mounts replace the file rather than write it. Bursts
// of events (an editor's save) become one reload after 200 ms of quiet.
func watchFile(ctx context.Context, path string, r *reloads, log *zap.Logger) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Error("reload.watch: cannot watch the configuration file; SIGHUP still reloads", zap.Error(err))
		return
	}
	abs, _ := filepath.Abs(path)
	if err := w.Add(filepath.Dir(abs)); err != nil {
		log.Error("reload.watch: cannot watch the configuration's directory; SIGHUP still reloads", zap.Error(err))
		_ = w.Close()
		return
	}
	go func() {
		defer w.Close()
		var quiet <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				// A config-map mount swaps a symlinked directory: any event there may be ours.
				if filepath.Clean(ev.Name) == abs || filepath.Base(ev.Name) == "..data" {
					quiet = time.After(200 * time.Millisecond)
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn("reload.watch: watcher error", zap.Error(err))
			case <-quiet:
				quiet = nil
				r.reload("file changed")
			}
		}
	}()
}
