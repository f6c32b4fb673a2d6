package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
)

// reloader re-reads the configuration file on SIGHUP (and, with reload.watch, when the file
// changes) and applies it to the running gateway; an invalid file is logged and the running
// configuration kept.
func reloader(ctx context.Context, path string, gw *gateway.Gateway, watch bool, log *zap.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload(path, gw, "SIGHUP", log)
			}
		}
	}()
	if watch {
		watchFile(ctx, path, gw, log)
	}
}

func reload(path string, gw *gateway.Gateway, why string, log *zap.Logger) {
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		log.Error("reload: the configuration file is invalid; the running configuration is kept", zap.String("trigger", why), zap.Error(err))
		return
	}
	if err := gw.Reload(cfg); err != nil {
		log.Error("reload: not applied; the running configuration is kept", zap.String("trigger", why), zap.Error(err))
	}
}

// watchFile reloads when path is written, created or renamed into place: its directory is
// watched, since editors and config-map mounts replace the file rather than write it. Bursts
// of events (an editor's save) become one reload after 200 ms of quiet.
func watchFile(ctx context.Context, path string, gw *gateway.Gateway, log *zap.Logger) {
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
				reload(path, gw, "file changed", log)
			}
		}
	}()
}
