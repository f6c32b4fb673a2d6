package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
)

const serveUsage = `usage: kvgate serve [--config PATH] [--pprof-listen ADDR]

Runs the gateway. Settings come from the YAML file, then KVGATE_* environment variables
(KVGATE_ and the setting's path: KVGATE_STATE_REDIS_URL, KVGATE_CANARY_SECRET, or with _FILE
appended to read it from a file); an unknown KVGATE_* variable refuses the start. kvgate check
validates a file without serving.

On SIGHUP (and, with reload.watch, when the file changes) the file is read again and its
backends, models, tenants, policy, tokenizer and discovery applied; an invalid file is logged
and the running configuration kept; requests in flight are not touched.

On SIGTERM or SIGINT: /readyz answers 503 for server.drain_delay while requests are still
served, then the listener closes and requests in flight have server.drain_timeout to finish.
Exit status: 0 once the drain is over (requests still open at drain_timeout are cut with an
error in their route's shape and logged: the drain did its job), 1 if the start failed or a
client connection could not be closed, 2 for a bad command line or configuration.

flags:
`

// newFlags is a command's flag set: -h and --help print usage to stdout and exit 0 (a request
// for help is not an error), a bad flag prints it to stderr and exits 2.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.String("config", "kvgate.yaml", "path of the YAML configuration")
	return fs
}

// parseFlags parses args; done means exit with code (help printed, or a bad flag).
func parseFlags(fs *flag.FlagSet, usage string, args []string) (code int, done bool) {
	err := fs.Parse(args)
	if err == nil {
		return 0, false
	}
	if errors.Is(err, flag.ErrHelp) {
		printUsage(os.Stdout, fs, usage)
		return 0, true
	}
	fmt.Fprintf(os.Stderr, "kvgate %s: %v\n", fs.Name(), err)
	printUsage(os.Stderr, fs, usage)
	return 2, true
}

func printUsage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprint(w, usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

func runServe(args []string) int {
	fs := newFlags("serve")
	fs.String("pprof-listen", "", "serve Go's profiles (net/http/pprof, /debug/pprof/) on this address, e.g. 127.0.0.1:6060; off when empty. They expose the process's internals: loopback only (make bench profiles the gateway with it)")
	if code, done := parseFlags(fs, serveUsage, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvgate serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if addr := fs.Lookup("pprof-listen").Value.String(); addr != "" {
		if err := servePprof(addr); err != nil {
			fmt.Fprintln(os.Stderr, "kvgate serve: --pprof-listen:", err)
			return 2
		}
	}
	cfg, err := config.Load(fs.Lookup("config").Value.String(), os.Environ())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvgate serve:", err)
		return 2
	}
	gateway.Version = version // kvgate_build_info
	log := gateway.NewLogger()
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	gw, ln, err := gateway.Start(ctx, cfg, log)
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	reloader(ctx, fs.Lookup("config").Value.String(), gw, cfg, cfg.Reload.Watch, log)
	log.Info("kvgate serving", zap.String("listen", ln.Addr().String()), zap.String("mode", string(cfg.Policy.Mode)),
		zap.Int("backends", len(cfg.Backends)), zap.Int("tenants", len(cfg.Tenants)))
	<-ctx.Done()
	code := drain(gw, cfg.Server, log)
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gw.StopTracing(fctx); err != nil {
		log.Warn("tracing: spans still queued at exit were not all exported", zap.Error(err))
	}
	return code
}

// drain runs the two phases of a shutdown: readiness 503 while still serving (drain_delay), then
// no new connections and requests in flight finishing (drain_timeout). Requests still open at the
// deadline are cut (each with its error event and access line): that is the drain working as
// configured, so the exit is 0. Only a connection left open after the cut makes it 1.
func drain(gw *gateway.Gateway, s config.Server, log *zap.Logger) int {
	gw.StartDrain()
	log.Info("draining: /readyz answers 503, still serving", zap.Duration("drain_delay", s.DrainDelay),
		zap.Duration("drain_timeout", s.DrainTimeout))
	time.Sleep(s.DrainDelay)
	log.Info("draining: no new connections, waiting for requests in flight", zap.Duration("drain_timeout", s.DrainTimeout))
	res := gw.Drain(s.DrainTimeout)
	if res.Open > 0 {
		log.Error("drain incomplete: client connections still open after the cut",
			zap.Int("cut", len(res.Cut)), zap.Strings("request_ids", res.Cut), zap.Int("connections_left_open", res.Open))
		return 1
	}
	if len(res.Cut) > 0 {
		log.Warn("drained: requests still open at server.drain_timeout were cut with shutting_down",
			zap.Int("cut", len(res.Cut)), zap.Strings("request_ids", res.Cut))
		return 0
	}
	log.Info("stopped: every request finished")
	return 0
}
