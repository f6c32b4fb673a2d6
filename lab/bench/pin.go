package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Pinning and CPU accounting for the proxy-alone phase (issue 33): each party gets its own
// cores through taskset, and a proxy's cost is the CPU time its processes used, read from
// /proc/<pid>/stat (utime + stime, in clock ticks), not its throughput on a shared machine.

// pinning is which cores each party runs on ("" everywhere when pinning is off).
type pinning struct {
	Cores  int    `json:"cores"`
	Proxy  string `json:"proxy_cpus"`  // the proxy under test, alone
	Engine string `json:"engine_cpus"` // the simulators (the engine stand-ins)
	Load   string `json:"load_cpus"`   // this process: the load generator
	All    string `json:"-"`           // every core, to undo the load generator's pin
	Note   string `json:"note,omitempty"`
}

// planPinning splits n cores: the proxy gets proxyCores of its own (the last ones), the
// simulators and the load generator share the rest (2 cores: both on core 0), or split it in
// halves when there are 4 or more left.
func planPinning(n, proxyCores int) pinning {
	p := pinning{Cores: n, All: cpuRange(0, n-1)}
	if _, err := exec.LookPath("taskset"); err != nil {
		p.Note = "taskset not found: nothing pinned, the figures include the parties' contention"
		return p
	}
	if n < 2 {
		p.Note = "one core: nothing pinned"
		return p
	}
	proxyCores = max(1, min(proxyCores, n-1))
	rest := n - proxyCores
	p.Proxy = cpuRange(rest, n-1)
	if rest < 4 {
		p.Engine, p.Load = cpuRange(0, rest-1), cpuRange(0, rest-1)
		return p
	}
	p.Engine, p.Load = cpuRange(0, rest/2-1), cpuRange(rest/2, rest-1)
	return p
}

func cpuRange(a, b int) string {
	if a == b {
		return strconv.Itoa(a)
	}
	return fmt.Sprintf("%d-%d", a, b)
}

func (p pinning) on() bool { return p.Proxy != "" }

// wrap runs argv on cpus (taskset execs it: the pid stays argv's).
func (p pinning) wrap(cpus string, argv []string) []string {
	if !p.on() {
		return argv
	}
	return append([]string{"taskset", "-c", cpus}, argv...)
}

// pinSelf moves every thread of this process to cpus (threads started later inherit it).
func pinSelf(cpus string) error {
	if cpus == "" {
		return nil
	}
	out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(os.Getpid())).CombinedOutput()
	if err != nil {
		return fmt.Errorf("taskset -a -p -c %s: %v: %s", cpus, err, bytes.TrimSpace(out))
	}
	return nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on every Linux build that
// matters; getconf says so when it can).
func clockTicks() int64 {
	if out, err := exec.Command("getconf", "CLK_TCK").Output(); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}

// procStat is one process's parent and CPU time (utime + stime, every thread of it).
type procStat struct {
	ppid  int
	ticks int64
}

// readProcStat parses /proc/<pid>/stat: fields after the command's closing parenthesis are
// state, ppid, …, utime (14th field of the line), stime (15th).
func readProcStat(path string) (procStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

func parseProcStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("no command in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("short stat line %q", b)
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, fmt.Errorf("bad stat line %q", b)
	}
	return procStat{ppid: ppid, ticks: ut + st}, nil
}

// treeTicks is the CPU time, in clock ticks, of root and every process below it: a Go proxy is
// one process, nginx a master and its workers (below the guard this bench puts over it, whose
// own time is a few ticks at start). A child that already exited is not counted (none of the
// parties' workers exit during a run).
func treeTicks(root int) (int64, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	stats := map[int]procStat{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readProcStat(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			stats[pid] = s
		}
	}
	if _, ok := stats[root]; !ok {
		return 0, fmt.Errorf("process %d is gone", root)
	}
	children := map[int][]int{}
	for pid, s := range stats {
		children[s.ppid] = append(children[s.ppid], pid)
	}
	var sum int64
	stack := []int{root}
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		sum += stats[pid].ticks
		stack = append(stack, children[pid]...)
	}
	return sum, nil
}

// cpuSplit is where a CPU profile's samples went, by what their stacks contain.
type cpuSplit struct {
	Profile       string  `json:"profile"`
	TotalSeconds  float64 `json:"total_seconds"`
	FingerprintPc float64 `json:"fingerprint_pct"` // fingerprint/… and gateway's notePrompt (hashing, winnowing, the index)
	CountingPct   float64 `json:"counting_pct"`    // admission/…, policy/…, tokenize/…, tiktoken, chat template rendering
	CanaryPct     float64 `json:"canary_pct"`      // canary/… (the prompt searched for marker fragments before the marker goes in)
	ParsingPct    float64 `json:"request_parsing_pct"`
	GCPct         float64 `json:"gc_pct"`
	OtherPct      float64 `json:"other_pct"`
}

// splitProfile classifies every sample of a CPU profile (go tool pprof -traces) by its stack:
// fingerprinting first (a stack under notePrompt or in package fingerprint), then counting
// (admission, policy, tokenize and below, a tiktoken library, the chat template's rendering),
// the canary (package canary), request parsing (package request), background GC, and the rest
// (fasthttp, system calls, the allocator outside GC). Each sample goes to one class, so the
// shares add up to 100%.
func splitProfile(file string) (*cpuSplit, error) {
	out, err := exec.Command("go", "tool", "pprof", "-traces", file).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -traces %s: %w", file, err)
	}
	return parseTraces(file, out)
}

func parseTraces(file string, out []byte) (*cpuSplit, error) {
	var total, fp, cnt, can, parse, gc float64
	var value float64
	var stack []string
	flush := func() {
		if value == 0 {
			return
		}
		total += value
		joined := strings.Join(stack, "\n")
		switch {
		case strings.Contains(joined, "kvgate/fingerprint.") || strings.Contains(joined, ".notePrompt"):
			fp += value
		case strings.Contains(joined, "kvgate/admission.") || strings.Contains(joined, "kvgate/policy.") ||
			strings.Contains(joined, "kvgate/tokenize") || strings.Contains(joined, "tiktoken") || strings.Contains(joined, "RenderTemplate"):
			cnt += value
		case strings.Contains(joined, "kvgate/canary."):
			can += value
		case strings.Contains(joined, "kvgate/request."):
			parse += value
		case strings.Contains(joined, "runtime.gcBgMarkWorker"):
			gc += value
		}
		value, stack = 0, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----------+") {
			flush()
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || strings.Contains(line, ": ") && value == 0 && len(stack) == 0 && !looksLikeDuration(f[0]) {
			continue // the header (File:, Type:, Time:, Duration:)
		}
		if len(stack) == 0 && len(f) >= 2 && looksLikeDuration(f[0]) {
			d, _ := parseDur(f[0])
			value = d
			stack = append(stack, f[1])
			continue
		}
		if value != 0 {
			stack = append(stack, f[0])
		}
	}
	flush()
	if total == 0 {
		return nil, fmt.Errorf("no samples in %s", file)
	}
	pc := func(v float64) float64 { return round1(100 * v / total) }
	return &cpuSplit{Profile: file, TotalSeconds: round3(total), CountingPct: pc(cnt), FingerprintPc: pc(fp), CanaryPct: pc(can),
		ParsingPct: pc(parse), GCPct: pc(gc), OtherPct: pc(total - cnt - fp - can - parse - gc)}, nil
}

func looksLikeDuration(s string) bool {
	_, ok := parseDur(s)
	return ok
}

// parseDur reads pprof's sample values ("10ms", "1.20s", "500us"), in seconds.
func parseDur(s string) (float64, bool) {
	for _, u := range []struct {
		suf string
		mul float64
	}{{"ms", 1e-3}, {"us", 1e-6}, {"µs", 1e-6}, {"ns", 1e-9}, {"s", 1}} {
		if v, ok := strings.CutSuffix(s, u.suf); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			return n * u.mul, true
		}
	}
	return 0, false
}
