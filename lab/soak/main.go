// Command soak holds many concurrent streams through a real `kvgate serve` process to real
// `kvgate sim` processes for a while, then reports errors, the gateway's RSS and goroutines
// before and after. It is `make soak`, never part of `make test`: it needs tens of thousands of
// file descriptors (it raises RLIMIT_NOFILE for itself and its children) and most of a machine.
// Everything listens on 127.0.0.1 only.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("kvgate", "bin/kvgate", "the kvgate binary (the gateway)")
	lab := flag.String("lab", "bin/kvgate-lab", "the kvgate-lab binary (the simulator)")
	streams := flag.Int("streams", 10000, "concurrent streams held open")
	duration := flag.Duration("duration", 60*time.Second, "how long the load runs")
	sims := flag.Int("sims", 2, "simulator processes behind the gateway")
	tokens := flag.Int("tokens", 10, "tokens per stream")
	delay := flag.Duration("token-delay", time.Second, "the simulator's delay between tokens")
	ramp := flag.Duration("ramp", 10*time.Second, "time over which the streams are opened")
	canary := flag.Bool("canary", true, "inject and scan canary markers")
	settle := flag.Duration("settle", 25*time.Second, "wait after the load before the after-figures (130s: past the runtime's forced GC, so heap in use is live data only)")
	gateways := flag.Int("gateways", 0, "gateway processes (0: as many as the fd limit needs, 2 descriptors per stream each)")
	flag.Parse()
	os.Exit(run(*bin, *lab, *streams, *sims, *gateways, *tokens, *duration, *delay, *ramp, *settle, *canary))
}

type proc struct {
	cmd  *exec.Cmd
	addr string
	out  *bytes.Buffer
	mu   *sync.Mutex
}

type lockedBuf struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<20 {
		l.b.Reset()
	}
	return l.b.Write(p)
}

func start(bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, out: &bytes.Buffer{}, mu: &sync.Mutex{}}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = lockedBuf{p.mu, p.out}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = lockedBuf{p.mu, p.out}.Write([]byte(line + "\n"))
			if a, ok := strings.CutPrefix(line, "listening on "); ok {
				select {
				case addr <- strings.TrimSpace(a):
				default:
				}
			}
		}
		_, _ = io.Copy(lockedBuf{p.mu, p.out}, stdout)
	}()
	if args[0] == "sim" {
		select {
		case p.addr = <-addr:
		case <-time.After(10 * time.Second):
			return nil, fmt.Errorf("%v printed no address", args)
		}
	}
	return p, nil
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(35 * time.Second):
		_ = p.cmd.Process.Kill()
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// raiseNoFile lifts the fd limit as far as the process may (a root process past the hard limit).
func raiseNoFile(want uint64) uint64 {
	var lim syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if lim.Max < want {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}); err == nil {
			return want
		}
	}
	lim.Cur = lim.Max // as far as the hard limit allows (raising that needs CAP_SYS_RESOURCE)
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur
}

type gauges struct {
	rss        float64
	heap       float64 // Go heap in use: what RSS would shrink to once the runtime returns the rest
	goroutines float64
	fds        float64
}

// scrapeKey reads the gateways' /metrics (it needs a key by default).
const scrapeKey = "soak-scrape-key"

func scrape(base string) (gauges, error) {
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+scrapeKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gauges{}, err
	}
	defer resp.Body.Close()
	var g gauges
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "process_resident_memory_bytes":
			g.rss = v
		case "go_goroutines":
			g.goroutines = v
		case "process_open_fds":
			g.fds = v
		case "go_memstats_heap_inuse_bytes":
			g.heap = v
		}
	}
	return g, sc.Err()
}

type stats struct {
	started, completed, events atomic.Int64
	mu                         sync.Mutex
	errors                     map[string]int
	firstByte                  []time.Duration
	maxOpen, open              atomic.Int64
}

func (s *stats) fail(kind string) {
	s.mu.Lock()
	s.errors[kind]++
	s.mu.Unlock()
}

func run(bin, lab string, streams, nsims, gateways, tokens int, duration, delay, ramp, settle time.Duration, canary bool) int {
	limit := raiseNoFile(uint64(4*streams + 10000))
	fmt.Printf("soak: %d streams for %s, %d tokens each %s apart, %d simulators; RLIMIT_NOFILE %d\n", streams, duration, tokens, delay, nsims, limit)
	var simProcs []*proc
	defer func() {
		for _, p := range simProcs {
			_ = p.cmd.Process.Kill()
		}
	}()
	var backends strings.Builder
	for i := 0; i < nsims; i++ {
		p, err := start(lab, "sim", "--mode", "combined", "--listen", "127.0.0.1:0", "--pool-tokens", "1048576", "--context-length", "8192",
			"--page-size", "16", "--token-delay", delay.String(), "--quiet", "--seed", strconv.Itoa(i+1))
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
		simProcs = append(simProcs, p)
		fmt.Fprintf(&backends, "  - {name: sim%d, url: \"http://%s\", role: unified}\n", i, p.addr)
	}
	key := "sk-soak"
	sum := sha256.Sum256([]byte(key))
	scrapeSum := sha256.Sum256([]byte(scrapeKey))
	// Each stream holds two descriptors in a gateway (client and upstream connection): with fewer
	// than that, the streams are spread over replicas sharing nothing but the backends.
	ngw := gateways
	if ngw <= 0 {
		ngw = max(1, (2*streams+2000+int(limit)-1)/int(limit))
	}
	dir, _ := os.MkdirTemp("", "kvgate-soak-")
	defer os.RemoveAll(dir)
	var gws []*proc
	var bases []string
	defer func() {
		for _, g := range gws {
			_ = g.cmd.Process.Kill()
		}
	}()
	per := (streams + ngw - 1) / ngw
	for i := 0; i < ngw; i++ {
		port := freePort()
		cfg := fmt.Sprintf("listen: \"127.0.0.1:%d\"\nbackends:\n%stenants: [{name: soak, key_sha256: %q}]\n"+
			"upstream: {max_conns: %d}\nserver: {max_conns: %d, drain_delay: 0s, metrics_key_sha256: %q}\ncanary: {enabled: %v, secret: soak-test-secret-padded-to-32-bytes}\n",
			port, backends.String(), hex.EncodeToString(sum[:]), 2*per+100, 2*per+100, hex.EncodeToString(scrapeSum[:]), canary)
		cfgPath := filepath.Join(dir, fmt.Sprintf("kvgate-%d.yaml", i))
		_ = os.WriteFile(cfgPath, []byte(cfg), 0o600)
		gw, err := start(bin, "serve", "--config", cfgPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
		gws, bases = append(gws, gw), append(bases, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	fmt.Printf("soak: %d gateway process(es), %d streams each\n", ngw, per)
	deadline := time.Now().Add(15 * time.Second)
	for i, base := range bases {
		for {
			if r, err := http.Get(base + "/readyz"); err == nil {
				r.Body.Close()
				if r.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				gws[i].mu.Lock()
				fmt.Fprintf(os.Stderr, "soak: gateway not ready:\n%s\n", gws[i].out.String())
				gws[i].mu.Unlock()
				return 2
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	scrapeAll := func() gauges {
		var sum gauges
		for _, b := range bases {
			g, _ := scrape(b)
			sum.rss, sum.heap, sum.goroutines, sum.fds = sum.rss+g.rss, sum.heap+g.heap, sum.goroutines+g.goroutines, sum.fds+g.fds
		}
		return sum
	}
	before := scrapeAll()

	st := &stats{errors: map[string]int{}}
	tr := &http.Transport{MaxIdleConns: streams + 100, MaxIdleConnsPerHost: per + 100, IdleConnTimeout: 90 * time.Second,
		DisableCompression: true, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}
	client := &http.Client{Transport: tr, Timeout: 60*time.Second + time.Duration(tokens)*delay}
	body := fmt.Sprintf(`{"text":"soak stream: tell me about the weather in some detail","sampling_params":{"max_new_tokens":%d},"stream":true}`, tokens)
	// New streams start until stopAt; those open then run to their end.
	stopAt := time.Now().Add(ramp + duration)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	loadStart := time.Now()
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(int64(ramp) * int64(i) / int64(streams)))
			for time.Now().Before(stopAt) {
				if !one(ctx, client, bases[i%len(bases)], key, body, st) {
					time.Sleep(200 * time.Millisecond) // no tight retry loop on an error
				}
			}
		}(i)
	}
	// Sample the gateways while the load runs.
	var peakMu sync.Mutex
	var peak gauges
	go func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			g := scrapeAll()
			peakMu.Lock()
			peak.rss, peak.heap, peak.goroutines, peak.fds = max(peak.rss, g.rss), max(peak.heap, g.heap), max(peak.goroutines, g.goroutines), max(peak.fds, g.fds)
			peakMu.Unlock()
			fmt.Printf("  t=%3.0fs open=%5d completed=%7d events=%8d gateway goroutines=%.0f rss=%.0fMiB fds=%.0f\n",
				time.Since(loadStart).Seconds(), st.open.Load(), st.completed.Load(), st.events.Load(), g.goroutines, g.rss/(1<<20), g.fds)
		}
	}()
	wg.Wait()
	cancel() // stops the sampler
	tr.CloseIdleConnections()
	elapsed := time.Since(loadStart)
	// Connections close, goroutines end: fasthttp keeps idle server workers and idle upstream
	// connections for 10 s (MaxIdleWorkerDuration, MaxIdleConnDuration) and sweeps them every 10 s:
	// a pool, not a leak.
	time.Sleep(settle)
	after := scrapeAll()
	peakMu.Lock()
	defer peakMu.Unlock()
	if after.goroutines-before.goroutines > 20 {
		// What is still running: Go prints every goroutine's stack on SIGQUIT.
		_ = gws[0].cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(time.Second)
		gws[0].mu.Lock()
		_ = os.WriteFile("kvgate-soak-goroutines.txt", gws[0].out.Bytes(), 0o644)
		gws[0].mu.Unlock()
		fmt.Println("soak: goroutine dump of the first gateway in kvgate-soak-goroutines.txt")
	}
	code := 0
	for _, g := range gws {
		g.stop()
		code = max(code, g.cmd.ProcessState.ExitCode())
	}
	gw := gws[0]

	st.mu.Lock()
	defer st.mu.Unlock()
	sort.Slice(st.firstByte, func(i, j int) bool { return st.firstByte[i] < st.firstByte[j] })
	pct := func(p float64) time.Duration {
		if len(st.firstByte) == 0 {
			return 0
		}
		return st.firstByte[min(len(st.firstByte)-1, int(p*float64(len(st.firstByte))))]
	}
	nerr := 0
	for _, n := range st.errors {
		nerr += n
	}
	report := map[string]any{
		"streams": streams, "gateways": ngw, "rlimit_nofile": limit, "duration_s": duration.Seconds(), "elapsed_s": elapsed.Seconds(),
		"started": st.started.Load(), "completed": st.completed.Load(), "events": st.events.Load(),
		"max_open": st.maxOpen.Load(), "errors": nerr, "errors_by_kind": st.errors,
		"first_event_p50_ms": pct(0.5).Milliseconds(), "first_event_p99_ms": pct(0.99).Milliseconds(),
		"gateway_before": map[string]float64{"rss_mib": before.rss / (1 << 20), "heap_inuse_mib": before.heap / (1 << 20), "goroutines": before.goroutines, "fds": before.fds},
		"gateway_peak":   map[string]float64{"rss_mib": peak.rss / (1 << 20), "heap_inuse_mib": peak.heap / (1 << 20), "goroutines": peak.goroutines, "fds": peak.fds},
		"gateway_after":  map[string]float64{"rss_mib": after.rss / (1 << 20), "heap_inuse_mib": after.heap / (1 << 20), "goroutines": after.goroutines, "fds": after.fds},
		"gateway_exit":   code,
	}
	out, _ := json.MarshalIndent(report, "", "  ")
	fmt.Println(string(out))
	growth := after.goroutines - before.goroutines
	if nerr > 0 || growth > 20 || code != 0 {
		fmt.Printf("soak: FAIL (%d errors, %+.0f goroutines %s after the load, gateway exit %d)\n", nerr, growth, settle, code)
		if nerr > 0 {
			gw.mu.Lock()
			tail := gw.out.String()
			gw.mu.Unlock()
			if len(tail) > 4000 {
				tail = tail[len(tail)-4000:]
			}
			fmt.Println("gateway log tail:\n" + tail)
		}
		return 1
	}
	fmt.Printf("soak: PASS (0 errors, goroutines %+.0f after the load)\n", growth)
	return 0
}

// one runs one stream to its end and records what went wrong, if anything.
func one(ctx context.Context, client *http.Client, base, key, body string, st *stats) bool {
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/generate", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	st.started.Add(1)
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			st.fail("transport: " + shortErr(err))
		}
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		st.fail(fmt.Sprintf("status %d %s", resp.StatusCode, b))
		return false
	}
	if n := st.open.Add(1); n > st.maxOpen.Load() {
		st.maxOpen.Store(n)
	}
	defer st.open.Add(-1)
	br := bufio.NewReader(resp.Body)
	first, done := true, false
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			if first {
				first = false
				st.mu.Lock()
				st.firstByte = append(st.firstByte, time.Since(t0))
				st.mu.Unlock()
			}
			st.events.Add(1)
			data := strings.TrimSpace(line[6:])
			if data == "[DONE]" {
				done = true
			} else if strings.Contains(data, `"error"`) {
				st.fail("error event: " + data[:min(len(data), 200)])
				return false
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && done {
				st.completed.Add(1)
				return true
			}
			if ctx.Err() != nil {
				return true // the run ended mid-stream: not an error of the gateway
			}
			st.fail("stream: " + shortErr(err))
			return false
		}
	}
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}
