package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain lets the smoke run re-execute this test binary as the bare proxy.
func TestMain(m *testing.M) {
	childRole()
	os.Exit(m.Run())
}

func TestParseBench(t *testing.T) {
	out := parseBench(strings.NewReader(`goos: linux
BenchmarkScanThroughput/markers=100-2         	       5	   2186004 ns/op	1921.84 MB/s	       0 B/op	       0 allocs/op	       104.0 live-markers
BenchmarkRequest/chat-2           	    2000	     62733 ns/op	   15687 B/op	     427 allocs/op
PASS
`))
	m := out["BenchmarkScanThroughput/markers=100"]
	if m["ns_per_op"] != 2186004 || m["mb_per_s"] != 1921.84 || m["allocs_per_op"] != 0 || m["live-markers"] != 104 || m["iterations"] != 5 {
		t.Fatalf("%v", out)
	}
	if r := out["BenchmarkRequest/chat"]; r["bytes_per_op"] != 15687 || r["allocs_per_op"] != 427 {
		t.Fatalf("%v", out)
	}
}

func TestStamp(t *testing.T) {
	ts, ok := stamp([]byte(`{"choices":[{"delta":{"content":"t1796000000123456789 "}}],"model":"t1"}`))
	if !ok || ts != 1796000000123456789 {
		t.Fatalf("%d %v", ts, ok)
	}
	if _, ok := stamp([]byte(`{"text":"t12 no"}`)); ok {
		t.Fatal("a short number is not a stamp")
	}
}

func TestPctAndRotate(t *testing.T) {
	d := []time.Duration{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	if pct(d, 0.5) != 5 || pct(d, 0.99) != 10 || pct(nil, 0.5) != 0 {
		t.Fatal(d)
	}
	ts := []*target{{name: "a"}, {name: "b"}, {name: "c"}}
	var names []string
	for _, x := range rotate(ts, 4) {
		names = append(names, x.name)
	}
	if !slices.Equal(names, []string{"b", "c", "a"}) {
		t.Fatal(names)
	}
}

// TestSmokeRunWritesTheReport runs the whole harness at a tiny size (rounds of a few tens of
// ms, 20 streams, no micro-benchmarks) and checks the JSON's shape only: no figure is judged
// here, timing belongs to `make bench`.
func TestSmokeRunWritesTheReport(t *testing.T) {
	bin, lab := os.Getenv("KVGATE_BIN"), os.Getenv("KVGATE_LAB_BIN")
	if bin == "" || lab == "" {
		t.Skip("KVGATE_BIN and KVGATE_LAB_BIN not set (make test sets them)")
	}
	p := quickParams()
	p.Mode = "smoke"
	p.Rounds, p.Dur = 2, 50*time.Millisecond
	p.RateRounds, p.RateDur, p.Rate = 1, 50*time.Millisecond, 200
	p.SweepRounds, p.SweepDur, p.Sweep = 1, 30*time.Millisecond, []int{1, 4}
	p.StreamRounds, p.StreamDur = 1, 50*time.Millisecond
	p.Warmup, p.MemStreams = 20*time.Millisecond, 20
	p.CountRounds, p.CountMin = 1, time.Millisecond
	// The proxy-alone phase at its smallest: a few requests per party and workload, two
	// prompts per size, a one-second profile.
	p.Proxy.SmallN, p.Proxy.BurstN, p.Proxy.BurstEvents = 40, 4, 4
	p.Proxy.PacedConns, p.Proxy.PacedN, p.Proxy.PacedEvents, p.Proxy.PacedIval = 4, 4, 3, time.Millisecond
	p.Proxy.PromptConc, p.Proxy.PromptN = []int{1, 2}, map[int]int{8 << 10: 2, 220 << 10: 2, 1 << 20: 2}
	p.Proxy.ProfileDur, p.Proxy.warmSmall, p.Proxy.warmBurst, p.Proxy.warmPacedConns = time.Second, 4, 2, 2
	p.Proxy.HFDir = findHFDir("")
	countOutDir = t.TempDir()
	out := filepath.Join(t.TempDir(), "latest.json")
	if code := run(context.Background(), p, config{kvgate: bin, lab: lab, nginx: findNginx(""), redis: "redis://127.0.0.1:6379/15", out: out, canary: true, limits: true, profile: true}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"count", "machine", "micro", "proxy", "ratios", "targets"}) {
		t.Fatalf("top-level keys %v", keys)
	}
	// The count section, also written on its own to bench/results/latest.json (here countOutDir).
	var counts struct {
		Count map[string]map[string]float64 `json:"count"`
	}
	rawCount, err := os.ReadFile(filepath.Join(countOutDir, "latest.json"))
	if err != nil || json.Unmarshal(rawCount, &counts) != nil {
		t.Fatalf("count file: %v", err)
	}
	for _, name := range countTextOrder {
		c := counts.Count[name]
		if c["kvgate_mb_s"] <= 0 || c["tiktoken_go_mb_s"] <= 0 || c["tokens"] <= 0 {
			t.Errorf("count %s: %v", name, c)
		}
	}
	var r struct {
		Targets map[string]map[string]any `json:"targets"`
		Ratios  map[string]*float64       `json:"ratios"`
		Machine map[string]any            `json:"machine"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	for _, n := range targetOrder {
		tr, ok := r.Targets[n]
		if !ok {
			t.Fatalf("no target %s", n)
		}
		if _, skipped := tr["skipped"]; skipped {
			continue
		}
		for _, k := range []string{"rps", "p50_ms", "p99_ms", "rate", "sweep", "stream"} {
			if _, ok := tr[k]; !ok {
				t.Errorf("%s: no %s", n, k)
			}
		}
	}
	if _, ok := r.Targets[tMemory]["memory"]; !ok {
		t.Error("kvgate_memory: no memory figure")
	}
	if _, ok := r.Ratios["redis_vs_memory"]; len(r.Ratios) != 3 || r.Ratios["kvgate_vs_bare"] == nil || !ok {
		t.Errorf("ratios %v", r.Ratios)
	}
	// The CPU profile of the gateway under the throughput load, and its top functions.
	if f, _ := r.Targets[tMemory]["cpu_profile"].(string); f == "" {
		t.Error("kvgate_memory: no cpu_profile")
	} else if top, err := os.ReadFile(strings.TrimSuffix(f, ".pprof") + "-top.txt"); err != nil || !strings.Contains(string(top), "flat%") {
		t.Errorf("profile summary of %s: %v %.200q", f, err, top)
	}
	checkProxySection(t, raw, p.Proxy)
	for _, k := range []string{"cores", "cpu_model", "go_version", "kernel"} {
		if _, ok := r.Machine[k]; !ok {
			t.Errorf("machine: no %s", k)
		}
	}
}

func TestParseOverhead(t *testing.T) {
	o := parseOverhead(`# HELP kvgate_overhead_seconds Time spent in kvgate
kvgate_overhead_seconds_bucket{phase="before_upstream",le="1e-06"} 0
kvgate_overhead_seconds_sum{phase="before_upstream"} 0.5
kvgate_overhead_seconds_count{phase="before_upstream"} 10000
kvgate_overhead_seconds_sum{phase="stream_read"} 0
kvgate_overhead_seconds_count{phase="stream_read"} 0
`)
	if len(o) != 1 || o["before_upstream"].MeanUs != 50 || o["before_upstream"].Count != 10000 {
		t.Fatalf("%+v", o)
	}
}

// checkProxySection checks the shape of the proxy phase's report: every party that ran has
// every workload with every request answered, the large prompts have every target at every
// size and concurrency, and the CPU split adds up.
func checkProxySection(t *testing.T, raw []byte, pp proxyParams) {
	t.Helper()
	var r struct {
		Proxy *proxyReport `json:"proxy"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Proxy == nil {
		t.Fatalf("proxy section: %v", err)
	}
	pr := r.Proxy
	if pr.ClockTicks <= 0 || pr.Pinning.Cores < 1 {
		t.Errorf("pinning %+v, clock ticks %d", pr.Pinning, pr.ClockTicks)
	}
	want := map[string]int{wSmall: pp.SmallN, wBurst: pp.BurstN, wPaced: pp.PacedN}
	events := map[string]int{wBurst: pp.BurstEvents, wPaced: pp.PacedEvents}
	for _, w := range workloadOrder {
		for _, n := range partyOrder {
			pc := pr.Workloads[w][n]
			if pr.Skipped[n] != "" {
				continue
			}
			if pc == nil {
				t.Errorf("%s: no %s", w, n)
				continue
			}
			if pc.Units+pc.Errors != want[w] || pc.Units == 0 || pc.Events != pc.Units*events[w] || pc.Ticks < 0 {
				t.Errorf("%s %s: %+v", w, n, pc)
			}
		}
	}
	seen := map[string]bool{}
	for _, pt := range pr.Prompts {
		if pt.Requests == 0 || pt.P50Ms <= 0 {
			t.Errorf("prompt %+v", pt)
		}
		seen[fmt.Sprintf("%s/%d/%d", pt.Target, pt.Bytes, pt.Conc)] = true
	}
	for _, target := range promptOrder {
		if pr.Skipped[target] != "" {
			continue
		}
		for _, size := range pp.PromptSizes {
			for _, c := range pp.PromptConc {
				if !seen[fmt.Sprintf("%s/%d/%d", target, size, c)] {
					t.Errorf("no prompt figure for %s at %d bytes, concurrency %d", target, size, c)
				}
			}
		}
		if target == ptDirect {
			continue
		}
		sp := pr.Split[target]
		if sp == nil {
			t.Errorf("no CPU split for %s", target)
			continue
		}
		if sum := sp.FingerprintPc + sp.CountingPct + sp.CanaryPct + sp.ParsingPct + sp.GCPct + sp.OtherPct; sp.TotalSeconds <= 0 || sum < 99.5 || sum > 100.5 {
			t.Errorf("CPU split %+v adds up to %.1f%%", sp, sum)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// A command with a space and a parenthesis: fields count from the last ')'.
	s, err := parseProcStat([]byte("4242 (kvgate (x) y) S 17 4242 4242 0 -1 4194560 1077 0 0 0 250 31 0 0 20 0 9 0 123 0 0\n"))
	if err != nil || s.ppid != 17 || s.ticks != 281 {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := parseProcStat([]byte("1 (init) S 0")); err == nil {
		t.Fatal("a short line must be an error")
	}
	// This process's own line parses and its parent is the one the kernel says.
	self, err := readProcStat("/proc/self/stat")
	if err != nil || self.ppid != os.Getppid() {
		t.Fatalf("%+v %v (ppid %d)", self, err, os.Getppid())
	}
	if n, err := treeTicks(os.Getpid()); err != nil || n < self.ticks {
		t.Fatalf("tree %d < own %d: %v", n, self.ticks, err)
	}
}

func TestPlanPinning(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset")
	}
	for _, c := range []struct {
		n, proxy            int
		wantP, wantE, wantL string
	}{
		{2, 1, "1", "0", "0"},
		{3, 1, "2", "0-1", "0-1"},
		{16, 1, "15", "0-6", "7-14"},
		{16, 4, "12-15", "0-5", "6-11"},
		{2, 4, "1", "0", "0"}, // the proxy never takes every core
	} {
		p := planPinning(c.n, c.proxy)
		if p.Proxy != c.wantP || p.Engine != c.wantE || p.Load != c.wantL || cpuCount(p.Proxy) != min(c.proxy, c.n-1) {
			t.Errorf("%d cores, %d for the proxy: %+v", c.n, c.proxy, p)
		}
	}
	if p := planPinning(1, 1); p.on() {
		t.Errorf("one core pinned: %+v", p)
	}
}

func TestParseTraces(t *testing.T) {
	out := `File: kvgate
Type: cpu
Duration: 2s, Total samples = 100ms (5.00%)
-----------+-------------------------------------------------------
      40ms   slices.Sort
             github.com/kvgate/kvgate/fingerprint.(*Index).Record
             github.com/kvgate/kvgate/gateway.(*exchange).notePrompt
-----------+-------------------------------------------------------
      30ms   github.com/kvgate/kvgate/tokenize/bpe.(*Counter).Count
             github.com/kvgate/kvgate/admission.(*Counter).Decide
-----------+-------------------------------------------------------
      10ms   github.com/kvgate/kvgate/canary.scanFast (inline)
-----------+-------------------------------------------------------
      10ms   runtime.scanobject
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
    1.00ms   syscall.Syscall
-----------+-------------------------------------------------------
     9000us  github.com/kvgate/kvgate/request.parse
-----------+-------------------------------------------------------
`
	sp, err := parseTraces("x.pprof", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if sp.TotalSeconds != 0.1 || sp.FingerprintPc != 40 || sp.CountingPct != 30 || sp.CanaryPct != 10 || sp.GCPct != 10 || sp.ParsingPct != 9 || sp.OtherPct != 1 {
		t.Fatalf("%+v", sp)
	}
	if _, err := parseTraces("x", []byte("File: x\n")); err == nil {
		t.Fatal("no samples must be an error")
	}
}
