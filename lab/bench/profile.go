package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// The CPU profiles of make bench: kvgate serve runs with --pprof-listen (its own loopback
// listener), and after the throughput rounds each kvgate target gets one more round of the same
// load, not counted in the figures, while its /debug/pprof/profile is read for that long. The
// profiles and their top functions go next to latest.json (cpu-<target>.pprof and
// cpu-<target>-top.txt); `go tool pprof -top FILE` reads them again.

// profileTarget profiles the kvgate at addr (its pprof listener at pprofAddr) under conns
// closed-loop connections for at least dur (a whole number of seconds: the profile's unit).
func profileTarget(ctx context.Context, name, addr, pprofAddr string, conns int, dur time.Duration, dir string) (string, error) {
	secs := max(1, int(math.Ceil(dur.Seconds())))
	type result struct {
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddr, secs))
		err := fasthttp.DoTimeout(req, resp, time.Duration(secs+30)*time.Second)
		if err == nil && resp.StatusCode() != 200 {
			err = fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
		}
		done <- result{append([]byte(nil), resp.Body()...), err}
	}()
	// The load covers the whole profile: it starts with it and ends after it.
	closedLoop(ctx, addr, conns, time.Duration(secs)*time.Second+200*time.Millisecond)
	r := <-done
	if r.err != nil {
		return "", fmt.Errorf("profiling %s: %w", name, r.err)
	}
	file := filepath.Join(dir, "cpu-"+name+".pprof")
	if err := os.WriteFile(file, r.body, 0o644); err != nil {
		return "", err
	}
	return file, nil
}

// profileTop is `go tool pprof -top` of a profile (cumulative and flat), written next to it.
func profileTop(file string, n int) (string, error) {
	var b strings.Builder
	for _, sort := range []string{"-cum", "-flat"} {
		out, err := exec.Command("go", "tool", "pprof", "-top", sort, fmt.Sprintf("-nodecount=%d", n), file).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("go tool pprof %s: %v: %s", file, err, out)
		}
		fmt.Fprintf(&b, "== go tool pprof -top %s -nodecount=%d %s\n%s\n", sort, n, filepath.Base(file), out)
	}
	top := strings.TrimSuffix(file, ".pprof") + "-top.txt"
	return b.String(), os.WriteFile(top, []byte(b.String()), 0o644)
}
