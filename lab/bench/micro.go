package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// microRun is one `go test -bench` invocation.
type microRun struct {
	pkg, bench, benchtime string
}

// microRuns are the micro-benchmarks the report quotes (they live in the packages they
// measure; this only runs them). quick keeps the cheap ones, with few iterations.
func microRuns(quick bool) []microRun {
	if quick {
		return []microRun{
			{"./gateway/", `^BenchmarkAdmission$/^tiktoken-go$/^8k$/^prose$`, "10x"},
			{"./gateway/", `^BenchmarkAdmission$/^tiktoken-go$/^1M$/^prose$/^(fits|over)$`, "1x"},
			{"./gateway/", `^BenchmarkRequest$|^BenchmarkRelayEvent$`, "2000x"},
			{"./canary/", `^BenchmarkScanThroughput$`, "3x"},
		}
	}
	return []microRun{
		{"./tokenize/", `^BenchmarkCount$/^tiktoken-go$/^mixed$`, "3x"},
		{"./tokenize/", `^BenchmarkCountEarlyExit$/^tiktoken-go`, "5x"},
		{"./gateway/", `^BenchmarkAdmission$/^tiktoken-go$/^8k$/`, "200x"},
		{"./gateway/", `^BenchmarkAdmission$/^tiktoken-go$/^(128k|1M)$/^prose$`, "3x"},
		{"./gateway/", `^BenchmarkRequest$|^BenchmarkRelayEvent$`, "1s"},
		{"./canary/", `^BenchmarkScanThroughput$|^BenchmarkScanEvent$`, "10x"},
	}
}

// runMicro runs each invocation from the module root, echoes its output (benchstat reads it
// as it is) to w and raw, and returns the parsed figures by benchmark name.
func runMicro(ctx context.Context, root string, runs []microRun, w, raw io.Writer) (map[string]map[string]float64, error) {
	out := map[string]map[string]float64{}
	for _, r := range runs {
		cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", r.bench, "-benchmem", "-benchtime", r.benchtime, "-count", "1", r.pkg)
		cmd.Dir = root
		cmd.Env = os.Environ()
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		err := cmd.Run()
		for _, line := range strings.Split(buf.String(), "\n") {
			if strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "pkg:") || strings.HasPrefix(line, "cpu:") {
				fmt.Fprintln(raw, line)
			}
			if strings.HasPrefix(line, "Benchmark") {
				fmt.Fprintln(w, "  "+line)
			}
		}
		if err != nil {
			return out, fmt.Errorf("go test -bench %s %s: %v\n%s", r.bench, r.pkg, err, buf.String())
		}
		for name, m := range parseBench(&buf) {
			out[name] = m
		}
	}
	return out, nil
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// parseBench reads `go test -bench` lines: name-P, iterations, then value-unit pairs.
// Units become keys: ns/op → ns_per_op, B/op → bytes_per_op, allocs/op → allocs_per_op,
// MB/s → mb_per_s; custom metrics keep their unit as the key.
func parseBench(r io.Reader) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		iters, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		m := map[string]float64{"iterations": iters}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			m[unitKey(f[i+1])] = v
		}
		out[procSuffix.ReplaceAllString(f[0], "")] = m
	}
	return out
}

func unitKey(u string) string {
	switch u {
	case "ns/op":
		return "ns_per_op"
	case "B/op":
		return "bytes_per_op"
	case "allocs/op":
		return "allocs_per_op"
	case "MB/s":
		return "mb_per_s"
	}
	return u
}
