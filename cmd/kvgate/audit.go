package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvgate/kvgate/audit"
)

// runAudit runs `kvgate audit`: the report goes to stdout (a table, or JSON with --json), the
// progress line to stderr. Exit 0: all passed (warnings allowed); 1: findings; 2: not audited.
func runAudit(args []string) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	var o audit.Options
	fs.StringVar(&o.Target, "target", "", "URL of one endpoint to audit: an engine, or a gateway in front of engines")
	fs.StringVar(&o.Prefill, "prefill", "", "URL of a prefill server (with --decode: audit the pair directly, as a PD router)")
	fs.StringVar(&o.Decode, "decode", "", "URL of the decode server paired with --prefill")
	fs.StringVar(&o.APIKey, "api-key", "", "sent as Authorization: Bearer KEY to every endpoint")
	fs.StringVar(&o.Model, "model", "", "model name in requests (default: the first /v1/models entry)")
	fs.BoolVar(&o.Native, "native", false, "use SGLang's /generate with input_ids instead of /v1/completions with text")
	fs.IntVar(&o.Limit, "limit", 0, "smallest prompt, in tokens, the target must refuse (default: discovered)")
	fs.IntVar(&o.Budget, "budget", audit.DefaultBudget, "cap on prompt tokens sent in all requests")
	fs.IntVar(&o.Concurrency, "concurrency", 1, "requests in flight at once")
	fs.DurationVar(&o.Timeout, "timeout", audit.DefaultTimeout, "bound on one request, reply included")
	fs.DurationVar(&o.MaxTime, "max-time", audit.DefaultMaxTime, "bound on the whole audit")
	fs.IntVar(&o.Warmups, "warmups", audit.DefaultWarmups, "marked warm-up requests before the isolation probe")
	noSalts := fs.Bool("no-salts", false, "skip the salt checks (does each backend's prefix cache keep salts apart?)")
	fs.StringVar(&o.SecondKey, "second-key", "", "through a kvgate gateway: a second tenant's key, so the salt checks compare two tenants' salts")
	fs.StringVar(&o.AdminKey, "admin-key", "", "through a kvgate gateway: its admin key, to list its backends and check each one's salts")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	quiet := fs.Bool("quiet", false, "no progress line on stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: kvgate audit --target URL [flags]\n       kvgate audit --prefill URL --decode URL [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return audit.ExitUnauditable
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvgate audit: unexpected arguments %q\n", fs.Args())
		return audit.ExitUnauditable
	}
	if o.Budget <= 0 {
		fmt.Fprintln(os.Stderr, "kvgate audit: --budget must be positive")
		return audit.ExitUnauditable
	}
	if o.Warmups == 0 {
		o.Warmups = -1 // the flag's 0 means none; the package's 0 means the default
	}
	o.NoSalts = *noSalts
	if !*quiet {
		o.Progress = progressLine()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r := audit.Run(ctx, o)
	var err error
	if *asJSON {
		err = r.WriteJSON(os.Stdout)
	} else {
		err = r.WriteTable(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvgate audit:", err)
	}
	if r.Error != "" && *asJSON {
		fmt.Fprintln(os.Stderr, "kvgate audit: cannot audit:", r.Error)
	}
	return r.ExitCode
}

// progressLine rewrites one line on a terminal; elsewhere (logs, CI) it prints one line a step.
func progressLine() func(string) {
	st, err := os.Stderr.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return func(s string) { fmt.Fprintln(os.Stderr, "kvgate audit:", s) }
	}
	return func(s string) { fmt.Fprintf(os.Stderr, "\r\033[K%s", s) }
}
