package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvgate/kvgate/lab/fairness"
)

// runFairness runs `kvgate-lab fairness`: the admission-queue experiment. The report goes to
// stdout (JSON with --json, else a table); progress goes to stderr.
func runFairness(args []string) int {
	fs := flag.NewFlagSet("fairness", flag.ContinueOnError)
	p := fairness.DefaultParams()
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	jsonOut := fs.String("json-out", "", "also write the JSON report to this file")
	short := fs.Bool("short", false, "a smoke run: 1 and 2 replicas, short windows (checks the report's shape, not its figures)")
	fs.StringVar(&p.Kvgate, "kvgate", defaultKvgate(), "the kvgate binary to start as the gateway replicas")
	fs.StringVar(&p.RedisURL, "redis-url", "redis://127.0.0.1:6379/15", "the Redis the replicas share")
	fs.StringVar(&p.Prefix, "prefix", fmt.Sprintf("kvgate-lab-fairness:%d:", time.Now().UnixNano()), "Redis key prefix of this run")
	replicas := fs.String("replicas", "", "comma-separated replica counts (default 1,2,4; --short 1,2)")
	setups := fs.String("setups", strings.Join(p.Setups, ","), "comma-separated set-ups: none, round_robin, fair (none is needed)")
	fs.StringVar(&p.HFDir, "hf-dir", "", "a model tokenizer directory for the engine and the gateways (exact local counts); default: cl100k, the gateways estimate")
	fs.IntVar(&p.PoolTokens, "pool-tokens", p.PoolTokens, "the simulated engine's KV pool in tokens")
	fs.DurationVar(&p.TokenDelay, "token-delay", p.TokenDelay, "the engine's time per generated token")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *short {
		p.Short()
	}
	var err error
	if *replicas != "" {
		if p.Replicas, err = parseInts(*replicas); err != nil {
			fmt.Fprintf(os.Stderr, "kvgate-lab fairness: --replicas: %v\n", err)
			return 2
		}
	}
	p.Setups = strings.Split(*setups, ",")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := fairness.Run(ctx, p, func(s string) { fmt.Fprintf(os.Stderr, "fairness: %s (%.0f s)\n", s, time.Since(start).Seconds()) })
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvgate-lab fairness: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "fairness: done in %.0f s\n", time.Since(start).Seconds())
	doc, _ := json.MarshalIndent(rep, "", "  ")
	doc = append(doc, '\n')
	if *jsonOut != "" {
		if err := os.WriteFile(*jsonOut, doc, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "kvgate-lab fairness: --json-out: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		_, _ = os.Stdout.Write(doc)
		return 0
	}
	printFairness(rep)
	return 0
}

// defaultKvgate is kvgate beside this binary, else the one on PATH.
func defaultKvgate() string {
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), "kvgate"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("kvgate"); err == nil {
		return p
	}
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func printFairness(rep *fairness.Report) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "setup\treplicas\tpool_full_hits\tkv_use\tlight\tanswered\tttft_p50_ms\tttft_p99_ms\tsolo_p50_ms\tsolo_p99_ms\trefused\tunanswered\tleftover_share\tshare_w4:w1\tjain\t")
	for _, r := range rep.Rows {
		for i, l := range r.Lights {
			if i == 0 {
				fmt.Fprintf(w, "%s\t%d\t%d\t%.2f\t", r.Setup, r.Replicas, r.PoolFullHits, r.KVUse)
			} else {
				fmt.Fprint(w, "\t\t\t\t")
			}
			fmt.Fprintf(w, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%d\t", l.Tenant, l.Requests, l.TTFTP50, l.TTFTP99, l.SoloTTFTP50, l.SoloTTFTP99, l.Refused, l.Unanswered)
			if i == 0 {
				fmt.Fprintf(w, "%.2f\t%.2f:%.2f\t%.2f\t\n", r.Heavy.LeftoverShare, r.WeightShare["4"], r.WeightShare["1"], r.Jain)
			} else {
				fmt.Fprint(w, "\t\t\t\n")
			}
		}
	}
	_ = w.Flush()
	fmt.Println(rep.Note)
}
