package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Target names, in table order; the JSON uses the same keys.
const (
	tDirect = "direct"
	tNginx  = "nginx"
	tBare   = "bare"
	tMemory = "kvgate_memory"
	tRedis  = "kvgate_redis"
)

var targetOrder = []string{tDirect, tNginx, tBare, tMemory, tRedis}

// fdSpare is the gateway's descriptors besides its streams' sockets (listener, logs, polls).
const fdSpare = 256

// target is one way to reach a simulator; every target exists twice, in front of the
// zero-latency simulator (set A: throughput, rate) and the one with a fixed latency (set B:
// sweep, streams).
type target struct {
	name  string
	addr  [2]string
	pprof string // kvgate's profile listener in set A (make bench -profile)
	skip  string // why it is not measured
}

// measure runs every phase and returns the report (partial if a phase failed).
func measure(ctx context.Context, p params, c config, ps *procs) (*report, error) {
	rep := newReport(p)
	log := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	log("kvgate bench (%s): %s", p.Mode, rep.Machine.summary())
	// Counting first, while nothing else of the bench runs.
	if p.CountRounds > 0 {
		c, err := measureCount(p.CountRounds, p.CountMin, log)
		rep.Count = c
		if err != nil {
			return rep, err
		}
	}
	// The proxy alone, its own processes pinned, before the other phases start theirs.
	if p.Proxy.Rounds > 0 || p.Proxy.PromptRounds > 0 {
		pr, err := measureProxy(ctx, p.Proxy, c, ps, log)
		rep.Proxy = pr
		if err != nil {
			return rep, fmt.Errorf("proxy phase: %w", err)
		}
	}
	// The gateway holds two sockets per stream (client and engine); the limit is per process and
	// children inherit it. Without CAP_SYS_RESOURCE the hard limit caps it, and the figure is
	// then taken at the most streams that fit and projected to the count asked for.
	want := p.MemStreams*2 + fdSpare
	if got := raiseNoFile(uint64(want)); got < uint64(want) && p.MemStreams > 0 {
		n := max(10, (int(got)-fdSpare)/2)
		log("open files limited to %d per process (hard limit): memory figure with %d streams instead of %d, projected to %d", got, n, p.MemStreams, p.MemStreams)
		p.MemStreams = n
	}

	// The two simulators.
	simArgs := [2][]string{{"--fast"}, {"--fast", "--fixed-delay", p.FixedDelay.String(), "--event-interval", p.EventIval.String(), "--fast-events", strconv.Itoa(p.Events)}}
	var simAddr [2]string
	for i := range 2 {
		addr, err := freeAddr()
		if err != nil {
			return rep, err
		}
		pr, err := ps.start(fmt.Sprintf("sim-%c", 'A'+i), append([]string{c.lab, "sim", "--listen", addr, "--quiet"}, simArgs[i]...))
		if err != nil {
			return rep, err
		}
		if err := waitReady(ctx, pr, addr, "/health", 10*time.Second); err != nil {
			return rep, err
		}
		simAddr[i] = addr
	}
	targets := map[string]*target{tDirect: {name: tDirect, addr: simAddr}}
	for _, n := range targetOrder[1:] {
		targets[n] = &target{name: n}
	}
	if c.nginx == "" {
		targets[tNginx].skip = "nginx not available: skipped (apt-get install nginx to compare; kvgate is still compared with the bare proxy)"
	} else {
		v, _ := exec.Command(c.nginx, "-v").CombinedOutput()
		rep.Machine.Nginx = strings.TrimSpace(string(v))
	}
	prefix := ""
	if err := redisPing(ctx, c.redis); err != nil {
		targets[tRedis].skip = fmt.Sprintf("Redis at %s not answering (%v): skipped", c.redis, err)
	} else {
		var b [6]byte
		_, _ = rand.Read(b[:])
		prefix = fmt.Sprintf("kvgate-bench:%d-%s:", os.Getpid(), hex.EncodeToString(b[:]))
		// The gateways first, so none writes a key after the cleanup.
		defer func() { ps.stopAll(); redisClean(c.redis, prefix) }()
	}
	// Start every proxy in front of each simulator; they wait idle until their turn.
	for i := range 2 {
		set := string(rune('A' + i))
		for _, n := range targetOrder[1:] {
			t := targets[n]
			if t.skip != "" {
				continue
			}
			pprofAddr := ""
			if c.profile && i == 0 && (n == tMemory || n == tRedis) {
				var err error
				if pprofAddr, err = freeAddr(); err != nil {
					return rep, err
				}
			}
			addr, err := startTarget(ctx, ps, c, n, set, simAddr[i], prefix, pprofAddr)
			if err != nil {
				return rep, fmt.Errorf("starting %s: %w", n, err)
			}
			t.addr[i] = addr
			if i == 0 {
				t.pprof = pprofAddr
			}
		}
	}
	var live []*target
	for _, n := range targetOrder {
		if t := targets[n]; t.skip != "" {
			log("%s: %s", n, t.skip)
			rep.Targets[n].Skipped = t.skip
		} else {
			live = append(live, t)
		}
	}
	// Connections, caches and the gateway's first capacity reading are warm before round 1.
	for _, t := range live {
		closedLoop(ctx, t.addr[0], p.Conns, p.Warmup)
		closedLoop(ctx, t.addr[1], 16, p.Warmup)
	}

	if p.Rounds > 0 {
		log("\n[1/5] throughput: %d connections, small non-streaming chat, zero-latency backend, %d rounds × %v", p.Conns, p.Rounds, p.Dur)
	}
	for r := range p.Rounds {
		for _, t := range rotate(live, r) {
			s := closedLoop(ctx, t.addr[0], p.Conns, p.Dur)
			rep.Targets[t.name].addRound(s)
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	rep.finishThroughput()
	if c.profile && p.Rounds > 0 {
		log("  CPU profiles (one more round each, not counted): kvgate serve --pprof-listen")
		for _, t := range live {
			if t.pprof == "" {
				continue
			}
			file, err := profileTarget(ctx, t.name, t.addr[0], t.pprof, p.Conns, p.Dur, filepath.Dir(c.out))
			if err != nil {
				return rep, err
			}
			top, err := profileTop(file, 25)
			if err != nil {
				log("  %s: %v", t.name, err)
				continue
			}
			rep.Targets[t.name].Profile = file
			log("  %s: %s\n%s", t.name, file, indent(firstLines(top, 22), "    "))
		}
	}

	if p.RateRounds > 0 {
		log("[2/5] latency at %d req/s: %d workers, zero-latency backend, %d rounds × %v", p.Rate, p.RateConns, p.RateRounds, p.RateDur)
	}
	for r := range p.RateRounds {
		for _, t := range rotate(live, r) {
			rep.Targets[t.name].addRate(fixedRate(ctx, t.addr[0], p.Rate, p.RateConns, p.RateDur))
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	rep.finishRate()
	for _, t := range live {
		if t.name != tMemory && t.name != tRedis {
			continue
		}
		if o, err := scrapeOverhead(t.addr[0]); err != nil {
			log("  %s: reading kvgate_overhead_seconds: %v", t.name, err)
		} else {
			rep.Targets[t.name].Overhead = o
		}
	}

	if p.SweepRounds > 0 {
		log("[3/5] sweep: backend +%v, connections %v, %d rounds × %v", p.FixedDelay, p.Sweep, p.SweepRounds, p.SweepDur)
	}
	for _, conns := range p.Sweep {
		for r := range p.SweepRounds {
			for _, t := range rotate(live, r) {
				rep.Targets[t.name].addSweep(conns, closedLoop(ctx, t.addr[1], conns, p.SweepDur))
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
	}
	rep.finishSweep()

	if p.StreamRounds > 0 {
		log("[4/5] streams: %d connections, backend +%v then %d events %v apart, %d rounds × %v", p.StreamConns, p.FixedDelay, p.Events, p.EventIval, p.StreamRounds, p.StreamDur)
	}
	for r := range p.StreamRounds {
		for _, t := range rotate(live, r) {
			rep.Targets[t.name].addStream(streams(ctx, t.addr[1], p.StreamConns, p.StreamDur))
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	rep.finishStreams()

	// Nothing else runs while the gateway holds its streams.
	ps.stopAll()
	if p.MemStreams > 0 {
		log("[5/5] memory: kvgate serve (memory state) holding %d slow streams", p.MemStreams)
		mem, err := memoryPhase(ctx, p, c, ps)
		rep.Targets[tMemory].Memory = mem
		if err != nil {
			rep.Targets[tMemory].MemoryError = err.Error()
			log("  memory: %v", err)
		}
	}
	ps.stopAll()
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}

	if c.micro {
		root, err := moduleRoot()
		if err != nil {
			return rep, err
		}
		log("\nmicro-benchmarks (go test -bench, from %s):", root)
		raw, err := os.Create(filepath.Join(filepath.Dir(c.out), "latest-micro.txt"))
		if err != nil {
			return rep, err
		}
		defer raw.Close()
		m, err := runMicro(ctx, root, microRuns(p.Mode == "quick"), os.Stdout, raw)
		rep.Micro = m
		if err != nil {
			return rep, err
		}
	}
	rep.print(os.Stdout)
	return rep, nil
}

// rotate starts round r at a different target, so no target always runs first or last.
func rotate(ts []*target, r int) []*target {
	k := r % len(ts)
	return append(slices.Clone(ts[k:]), ts[:k]...)
}

// startTarget starts one proxy named n in front of the simulator at sim and returns its
// address once it answers.
func startTarget(ctx context.Context, ps *procs, c config, n, set, sim, prefix, pprofAddr string) (string, error) {
	addr, err := freeAddr()
	if err != nil {
		return "", err
	}
	name := n + "-" + set
	var pr *proc
	ready := "/health" // the simulator's, through the proxy
	switch n {
	case tNginx:
		conf, err := nginxConfig(ps.dir, name, addr, sim)
		if err != nil {
			return "", err
		}
		pr, err = ps.startGuarded(name, nginxArgv(c.nginx, conf))
		if err != nil {
			return "", err
		}
	case tBare:
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		pr, err = ps.start(name, []string{self}, envRole+"=bare", envListen+"="+addr, envUpstream+"="+sim)
		if err != nil {
			return "", err
		}
	case tMemory, tRedis:
		redisURL := ""
		if n == tRedis {
			redisURL = c.redis
		}
		pr, err = startKvgate(ps, c, name, addr, sim, redisURL, prefix, pprofAddr)
		if err != nil {
			return "", err
		}
		ready = "/readyz" // every backend read
	}
	return addr, waitReady(ctx, pr, addr, ready, 15*time.Second)
}

// startKvgate runs `kvgate serve` with the full pipeline: a tenant with rate and token limits
// (set far above the load, so every request is checked and charged, none refused), canaries
// injected and scanned, state in memory or in Redis under a unique prefix, its logs (the access
// log included) to a file.
func startKvgate(ps *procs, c config, name, addr, sim, redisURL, prefix, pprofAddr string) (*proc, error) {
	state := `{redis_url: ""}`
	if redisURL != "" {
		state = fmt.Sprintf("{redis_url: %q, key_prefix: %q}", redisURL, prefix)
	}
	limits := ", rpm: 1000000000, tpm: 1000000000"
	if !c.limits {
		limits = ""
	}
	yaml := fmt.Sprintf(`listen: %s
backends: [{name: sim, url: "http://%s", role: unified}]
tenants: [{name: bench, key_sha256: %q%s}]
canary: {enabled: %v, secret: "kvgate bench secret, padded to 32 bytes"}
state: %s
capacity: {poll_interval: 2s}
upstream: {max_conns: 60000}
server: {drain_delay: 0s, metrics_key_sha256: %q}
`, addr, sim, hexSHA256(benchKey), limits, c.canary, state, hexSHA256(scrapeKey))
	conf := filepath.Join(ps.dir, name+".yaml")
	if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	argv := []string{c.kvgate, "serve", "--config", conf}
	if pprofAddr != "" {
		argv = append(argv, "--pprof-listen", pprofAddr)
	}
	return ps.start(name, argv)
}

// firstLines is the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

func indent(s, pre string) string {
	return pre + strings.ReplaceAll(s, "\n", "\n"+pre)
}

// memoryPhase starts a simulator whose streams last minutes (an event every 10 s) and a kvgate
// serve with memory state in front, and measures the gateway's RSS with p.MemStreams open.
func memoryPhase(ctx context.Context, p params, c config, ps *procs) (*memResult, error) {
	simAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	sim, err := ps.start("sim-C", []string{c.lab, "sim", "--listen", simAddr, "--quiet", "--fast", "--event-interval", "10s", "--fast-events", "60"})
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, sim, simAddr, "/health", 10*time.Second); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	gw, err := startKvgate(ps, c, "kvgate-memory-C", addr, simAddr, "", "", "")
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, gw, addr, "/readyz", 15*time.Second); err != nil {
		return nil, err
	}
	res, err := slowStreams(ctx, addr, gw.pid(), p.MemStreams, p.MemLimit)
	return &res, err
}

// raiseNoFile lifts RLIMIT_NOFILE (children inherit it) to at least n if it can, and returns
// the soft limit in effect.
func raiseNoFile(n uint64) uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	if l.Cur >= n {
		return l.Cur
	}
	want := syscall.Rlimit{Cur: n, Max: max(l.Max, n)}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil {
		// Without privilege only the soft limit can rise, up to the hard one.
		want = syscall.Rlimit{Cur: l.Max, Max: l.Max}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil {
			return l.Cur
		}
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	return l.Cur
}

func redisPing(ctx context.Context, url string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	// One quiet attempt: an absent Redis is a skipped target, not a page of retry logs.
	opt.MaxRetries, opt.DialerRetries, opt.DialTimeout = -1, 1, 500*time.Millisecond
	redis.SetLogger(quietLog{})
	cl := redis.NewClient(opt)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.Ping(ctx).Err()
}

type quietLog struct{}

func (quietLog) Printf(context.Context, string, ...any) {}

// redisClean deletes every key the run's gateways wrote under prefix.
func redisClean(url, prefix string) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return
	}
	cl := redis.NewClient(opt)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := cl.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		cl.Del(ctx, keys...)
	}
}

// moduleRoot is the directory of go.mod, for the go test runs.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the kvgate module: run from the repository root")
	}
	return filepath.Dir(mod), nil
}
