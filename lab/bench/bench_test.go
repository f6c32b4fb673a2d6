package main

import (
	"context"
	"encoding/json"
	"os"
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
	if !slices.Equal(keys, []string{"count", "machine", "micro", "ratios", "targets"}) {
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
