// Package backends owns the upstream set: each engine's live capacity (polled from /server_info
// and /v1/models), health, reported role, load, quarantine flags, the routes a request can take
// (unified backends and prefill+decode pairs), and the HTTP clients that reach them. It decides
// nothing about admission and never reads a request body.
package backends

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/policy"
)

// Capacity is one validated reading of an engine's limits (see decodeCapacity): every number
// is in range, and each limit is the smallest the engine stated.
type Capacity struct {
	PoolTokens int `json:"max_total_num_tokens"`
	// MaxReqInputLen is what admission uses: the reported max_req_input_len, cut to SGLang's
	// derivation from the pool and the context when it was larger.
	MaxReqInputLen int `json:"max_req_input_len"`
	// ReportedMaxReqInputLen is the engine's own number when it was larger than that (the
	// reading was inconsistent); 0 otherwise.
	ReportedMaxReqInputLen int `json:"reported_max_req_input_len,omitempty"`
	ContextLen             int `json:"max_model_len"`
	PageSize               int `json:"page_size"`
	// ReservedDecodeTokens is num_reserved_decode_tokens: a decode server preallocates a request
	// only while prompt + this fits its free pool. SGLang's default, 512, when not reported.
	ReservedDecodeTokens int    `json:"num_reserved_decode_tokens"`
	Mode                 string `json:"disaggregation_mode"`
	BootstrapPort        int    `json:"disaggregation_bootstrap_port"`
	Model                string `json:"model"`
	// UsedTokens is the engine's num_used_tokens (summed over DP ranks) from /v1/loads; -1 unknown.
	UsedTokens int       `json:"num_used_tokens"`
	ReadAt     time.Time `json:"read_at"`
}

// PoolBelowContext reports the incident's precondition: prompts in [mril, ctx) are rejected by
// the engine, or, on affected PD versions, leaked.
func (c *Capacity) PoolBelowContext() bool { return c.PoolTokens < c.ContextLen }

// Inconsistent: the engine reported a max_req_input_len its own pool and context cannot hold.
func (c *Capacity) Inconsistent() bool { return c.ReportedMaxReqInputLen > 0 }

// PoolAlarm is when the pool is smaller than what the engine advertises (its context, or its own
// max_req_input_len): the same alarm and metric for both, since both are the incident's shape.
func (c *Capacity) PoolAlarm() bool { return c.PoolBelowContext() || c.Inconsistent() }

// Backend is one configured engine.
type Backend struct {
	Name, APIKey string
	Role         config.Role
	// Model is the model the engine serves as configured ("" with no models: the gateway's one
	// model); Group narrows PD pairing within the model.
	Model, Group string
	// Addr is host:port; Host is the host alone (the prefill's bootstrap_host); base is
	// scheme://host:port, what every engine path is appended to.
	Addr, Host, base string
	// names is []string{Name}: a unified route's path names it without a slice per request.
	names []string
	// client streams requests to the engine (Send). Its timeouts are per read (see timedConn).
	client *fasthttp.HostClient

	// poll reads capacity; ctl carries /tokenize and /abort_request. Apart, so that a burst of
	// aborts or exact counts can never starve the capacity polls (which would take a healthy
	// backend out of rotation).
	poll, ctl *fasthttp.HostClient
	capacity  atomic.Pointer[Capacity]
	lastErr   atomic.Pointer[string]
	polled    atomic.Bool
	roleOK    atomic.Bool
	inflight  atomic.Int64 // prompt tokens of requests in flight through this gateway
	// reserved is the KV tokens (prompt + reserved output) of requests the admission queue
	// dispatched here and has not seen finish (Route.Reserve).
	reserved atomic.Int64
	// quarantinedUntil is unix nanoseconds; 0 when not quarantined.
	quarantinedUntil atomic.Int64
	infoPath         atomic.Value   // "/server_info" until it answers 404
	conns            *connSet       // the request client's connections (CutStreams)
	conf             config.Backend // what it was built from: a reconfiguration keeps it when unchanged
	log              *zap.Logger    // for panics recovered on the backend's own goroutines
}

// Capacity returns the last successful reading, or nil.
func (b *Backend) Capacity() *Capacity { return b.capacity.Load() }

// LastError is the last poll failure ("" when the last poll succeeded).
func (b *Backend) LastError() string {
	if p := b.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// RoleMatches reports whether the engine's disaggregation_mode matches the configured role.
func (b *Backend) RoleMatches() bool { return b.roleOK.Load() }

// QuarantinedUntil is the end of the backend's quarantine (zero time when none).
func (b *Backend) QuarantinedUntil() time.Time {
	if n := b.quarantinedUntil.Load(); n > 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// AddInflight accounts tokens of a request in flight (negative to release).
func (b *Backend) AddInflight(tokens int) { b.inflight.Add(int64(tokens)) }

// Inflight is the prompt tokens of requests in flight through this gateway.
func (b *Backend) Inflight() int64 { return b.inflight.Load() }

// Reserved is the KV tokens the admission queue dispatched here and has not seen finish.
func (b *Backend) Reserved() int64 { return b.reserved.Load() }

// KVFree estimates the backend's free KV tokens now: its pool minus what is in use, where in
// use is the larger of the engine's own num_used_tokens (which covers other clients' requests,
// but lags a burst by up to a poll) and what this gateway has dispatched and not seen finish
// (which covers the burst; the engine counts those too once running, so the two are not added).
// known is false when the engine reported no usage (no /v1/loads and no gauge): the caller
// fails closed.
func (b *Backend) KVFree() (free int64, known bool) {
	c := b.capacity.Load()
	if c == nil || c.UsedTokens < 0 {
		return 0, false
	}
	used := max(int64(c.UsedTokens), b.reserved.Load())
	return max(int64(c.PoolTokens)-used, 0), true
}

// Options are the set's timings.
type Options struct {
	PollInterval, MaxAge, PollTimeout  time.Duration
	ConnectTimeout                     time.Duration
	ResponseHeaderTimeout, IdleTimeout time.Duration
	MaxConns                           int
	Discovery                          Discovery
}

// Discovery is how discover: dns entries are resolved (config.Discovery).
type Discovery = config.Discovery

// Set is every backend: the configured ones and the members discovered for discover: dns
// entries. Membership changes (discovery, Reconfigure) replace list and byName under mu; a
// backend that leaves keeps serving the requests that hold it (they finish), takes no new ones,
// and is no longer polled.
type Set struct {
	mu         sync.RWMutex
	list       []*Backend
	byName     map[string]*Backend
	static     []config.Backend            // the configured entries, discover ones included
	discovered map[string][]config.Backend // per discover entry: one member per address
	answered   map[string]bool             // discover entries whose host was looked up once (or failed to be)
	resolving  map[string]resolver         // discover entries' resolver loops, by entry name
	quarantine map[string]time.Time        // the last SetQuarantine, for members that join
	runCtx     context.Context             // nil until Run
	pollers    map[*Backend]context.CancelFunc
	pollWG     sync.WaitGroup
	opts       Options
	log        *zap.Logger
	// OnCapacityChange is called (from the poller) when a backend's limits change; may be nil.
	OnCapacityChange func(b *Backend, old, cur *Capacity)
	// OnPolled is called (from the poller, after OnCapacityChange) after every successful
	// reading: work that must be retried until it succeeds (calibration); may be nil.
	OnPolled func(b *Backend)
}

// OptionsFrom takes the set's timings from the gateway configuration.
func OptionsFrom(cfg *config.Config) Options {
	return Options{
		PollInterval: cfg.Capacity.PollInterval, MaxAge: cfg.Capacity.MaxAge, PollTimeout: cfg.Capacity.Timeout,
		ResponseHeaderTimeout: cfg.Upstream.ResponseHeaderTimeout, IdleTimeout: cfg.Upstream.IdleTimeout,
		MaxConns: cfg.Upstream.MaxConns, Discovery: cfg.Discovery,
	}
}

// New builds the set; nothing is contacted until Run.
func New(cfgs []config.Backend, opts Options, log *zap.Logger) (*Set, error) {
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = 3 * time.Second
	}
	s := &Set{byName: map[string]*Backend{}, opts: opts, log: log.Named("backends")}
	s.static = append([]config.Backend(nil), cfgs...)
	s.discovered, s.answered = map[string][]config.Backend{}, map[string]bool{}
	s.pollers = map[*Backend]context.CancelFunc{}
	if err := s.apply(); err != nil {
		return nil, err
	}
	return s, nil
}

// newBackend builds the clients of one engine; nothing is contacted.
func (s *Set) newBackend(c config.Backend) (*Backend, error) {
	opts := s.opts
	scheme, addr, err := c.Address()
	if err != nil {
		return nil, fmt.Errorf("backend %s: url: %w", c.Name, err)
	}
	host, _, _ := net.SplitHostPort(addr)
	var tlsConf *tls.Config
	if scheme == "https" {
		if tlsConf, err = c.TLS.ClientConfig(); err != nil {
			return nil, fmt.Errorf("backend %s: tls: %w", c.Name, err)
		}
	}
	b := &Backend{Name: c.Name, Role: c.Role, Model: c.Model, Group: c.Group, APIKey: c.APIKey, Addr: addr, Host: host, base: scheme + "://" + addr, log: s.log,
		conns: &connSet{m: map[*timedConn]struct{}{}}, conf: c, names: []string{c.Name}}
	// Every client of an https backend speaks TLS only: fasthttp refuses a request whose
	// scheme differs from the client's, so nothing is ever sent in plaintext to it.
	isTLS := tlsConf != nil
	b.client = &fasthttp.HostClient{
		Addr:               addr,
		Name:               "kvgate",
		IsTLS:              isTLS,
		TLSConfig:          tlsConf,
		StreamResponseBody: true,
		MaxConns:           opts.MaxConns,
		// A request waits briefly for a connection instead of failing at once at MaxConns.
		MaxConnWaitTimeout: time.Second,
		Dial:               timedDialer(opts.ConnectTimeout, opts.ResponseHeaderTimeout, opts.IdleTimeout, b.conns),
		// Engines' replies are passed through; do not rewrite their header names.
		DisableHeaderNamesNormalizing: false,
	}
	b.poll = &fasthttp.HostClient{Addr: addr, Name: "kvgate-poll", IsTLS: isTLS, TLSConfig: tlsConf,
		ReadTimeout: opts.PollTimeout, WriteTimeout: opts.PollTimeout, MaxConns: 4}
	// A utility reply is read whole: bounded while it is read, not only after.
	b.ctl = &fasthttp.HostClient{Addr: addr, Name: "kvgate", IsTLS: isTLS, TLSConfig: tlsConf, MaxConns: 64, MaxConnWaitTimeout: time.Second,
		MaxResponseBodySize: maxCallReply}
	b.infoPath.Store("/server_info")
	return b, nil
}

// CutStreams ends every engine request of every backend, now and from now on: reads in
// progress and later ones fail with ErrCut, and no new connection is made. The end of a drain
// alone calls it (the process is about to exit).
func (s *Set) CutStreams() {
	for _, b := range s.All() {
		b.conns.cutAll()
	}
}

// All returns every backend now in configuration order (discovered members in place of their
// entry, in address order). The slice is the caller's.
func (s *Set) All() []*Backend {
	// members takes the read lock itself: holding it here too would be a recursive RLock, which
	// deadlocks once a writer (SetQuarantine on every quarantine sync) queues between the two.
	return append([]*Backend(nil), s.members()...)
}

// members is the member list now, read-only: apply replaces s.list whole, never writes into it,
// so the request path reads it without a copy.
func (s *Set) members() []*Backend {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.list
}

// Get returns the backend named name now, or nil.
func (s *Set) Get(name string) *Backend {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byName[name]
}

// Run polls every backend until ctx ends (the first round at once), a member added later from
// its addition; and re-resolves the entries with discover: dns.
func (s *Set) Run(ctx context.Context) {
	s.mu.Lock()
	s.runCtx = ctx
	for _, b := range s.list {
		s.startPollerLocked(b)
	}
	s.mu.Unlock()
	s.runDiscovery(ctx)
	<-ctx.Done()
	s.pollWG.Wait()
}

// pollSafely is one poll that a panic (a reading that trips a bug) cannot end the loop with.
func (s *Set) pollSafely(b *Backend) {
	defer func() {
		if v := recover(); v != nil {
			panics.Note(s.log, "poll", v)
			// What the reading held cannot be trusted: capacity unknown, so admission fails closed.
			b.capacity.Store(nil)
			msg := fmt.Sprintf("poll panicked: %v", v)
			b.lastErr.Store(&msg)
		}
	}()
	s.PollOnce(b)
}

// Ready reports whether every backend has been read or judged down at least once.
func (s *Set) Ready() bool {
	s.mu.RLock()
	for _, c := range s.static {
		if c.Discover == "dns" && !s.answered[c.Name] {
			s.mu.RUnlock()
			return false // its members are not known yet
		}
	}
	s.mu.RUnlock()
	for _, b := range s.All() {
		if !b.polled.Load() {
			return false
		}
	}
	return true
}

// PollOnce reads one backend's capacity now.
func (s *Set) PollOnce(b *Backend) {
	cur, err := s.read(b)
	// Ready only once this first reading has been acted on (logged, calibrated).
	defer b.polled.Store(true)
	if err != nil {
		msg := err.Error()
		if old := b.lastErr.Swap(&msg); old == nil || *old != msg {
			s.log.Warn("backend unreachable or unreadable", zap.String("backend", b.Name), zap.Error(err))
		}
		return
	}
	if old := b.lastErr.Swap(nil); old != nil {
		s.log.Info("backend answering again", zap.String("backend", b.Name))
	}
	want := map[config.Role]string{config.RoleUnified: "null", config.RolePrefill: "prefill", config.RoleDecode: "decode"}[b.Role]
	ok := cur.Mode == want
	if b.roleOK.Swap(ok) != ok || (!ok && b.capacity.Load() == nil) {
		if !ok {
			s.log.Error("backend reports a different role than configured: taken out of rotation",
				zap.String("backend", b.Name), zap.String("configured", string(b.Role)), zap.String("reported_disaggregation_mode", cur.Mode))
		}
	}
	old := b.capacity.Swap(cur)
	if old == nil || old.PoolTokens != cur.PoolTokens || old.MaxReqInputLen != cur.MaxReqInputLen || old.ContextLen != cur.ContextLen ||
		old.ReportedMaxReqInputLen != cur.ReportedMaxReqInputLen || old.Mode != cur.Mode {
		fields := []zap.Field{zap.String("backend", b.Name), zap.Int("pool_tokens", cur.PoolTokens),
			zap.Int("max_req_input_len", cur.MaxReqInputLen), zap.Int("context_len", cur.ContextLen), zap.String("mode", cur.Mode)}
		if cur.Inconsistent() {
			fields = append(fields, zap.Int("reported_max_req_input_len", cur.ReportedMaxReqInputLen))
		}
		if cur.PoolAlarm() {
			s.log.Error("KV pool is smaller than the advertised context or max_req_input_len: prompts between max_req_input_len and the context are rejected by the engine, or leaked by affected PD versions; kvgate refuses them", fields...)
		} else {
			s.log.Info("backend capacity", fields...)
		}
		if s.OnCapacityChange != nil {
			s.OnCapacityChange(b, old, cur)
		}
	}
	if s.OnPolled != nil {
		s.OnPolled(b)
	}
}

var errNotFound = errors.New("404")

func (s *Set) read(b *Backend) (*Capacity, error) {
	path := b.infoPath.Load().(string)
	info, err := s.get(b, path)
	if errors.Is(err, errNotFound) && path == "/server_info" {
		// Older SGLang only has the deprecated name.
		if info, err = s.get(b, "/get_server_info"); err == nil {
			b.infoPath.Store("/get_server_info")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading server info: %w", err)
	}
	models, err := s.get(b, "/v1/models")
	if err != nil {
		return nil, fmt.Errorf("reading /v1/models: %w", err)
	}
	c, err := decodeCapacity(info, models)
	if err != nil {
		return nil, err
	}
	var loads json.RawMessage
	if err := s.getJSON(b, "/v1/loads", &loads); err == nil {
		if n, ok := sumField(loads, "num_used_tokens"); ok {
			c.UsedTokens = n
		}
	}
	if c.UsedTokens < 0 {
		// Older engines have no /v1/loads; with --enable-metrics the same number is a gauge.
		if body, err := s.get(b, "/metrics"); err == nil {
			if n, ok := sumGauge(body, "num_used_tokens"); ok {
				c.UsedTokens = n
			}
		}
	}
	return c, nil
}

// decodeCapacity reads a capacity from the bodies of /server_info and /v1/models, engine bytes
// that are untrusted. Every number must be a JSON integer in range (no strings, fractions,
// exponents, signs or zeros where a size belongs): a reading with any number wrong, or without
// the pool, the input limit or the context, is an error, so the backend's capacity is unknown
// and admission fails closed. Where the engine states one limit in several places, the smallest
// is taken (capacity is the minimum of what the engine reports), and a max_req_input_len larger
// than SGLang's own derivation from the pool and the context is cut to it and flagged.
func decodeCapacity(infoBody, modelsBody []byte) (*Capacity, error) {
	var info map[string]json.RawMessage
	if err := json.Unmarshal(infoBody, &info); err != nil || info == nil {
		return nil, fmt.Errorf("reading server info: not a JSON object")
	}
	c := &Capacity{UsedTokens: -1}
	var err error
	if c.PoolTokens, err = needInt(info, "max_total_num_tokens", 1); err != nil {
		return nil, fmt.Errorf("reading server info: %w", err)
	}
	reportedMRIL, err := needInt(info, "max_req_input_len", 1)
	if err != nil {
		return nil, fmt.Errorf("reading server info: %w", err)
	}
	// The scheduler reserves a page per request (policy.Path.PageSize): without the page size
	// the schedulable edge is unknown, so the reading is.
	if c.PageSize, err = needInt(info, "page_size", 1); err != nil {
		return nil, fmt.Errorf("reading server info: %w", err)
	}
	if c.ReservedDecodeTokens, err = optInt(info, "num_reserved_decode_tokens", 0, defaultReservedDecodeTokens); err != nil {
		return nil, fmt.Errorf("reading server info: %w", err)
	}
	if c.BootstrapPort, err = optInt(info, "disaggregation_bootstrap_port", 0, 0); err != nil || c.BootstrapPort > 65535 {
		return nil, fmt.Errorf("reading server info: disaggregation_bootstrap_port is not a port")
	}
	if raw, ok := info["disaggregation_mode"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &c.Mode) != nil {
			return nil, fmt.Errorf("reading server info: disaggregation_mode is not a string")
		}
	}
	// The CLI flag (null unless set) caps the context when given.
	ctxFlag, err := optInt(info, "context_length", 1, 0)
	if err != nil {
		return nil, fmt.Errorf("reading server info: %w", err)
	}
	// Each DP rank's own pool: the top-level number is rank 0's.
	if raw, ok := info["internal_states"]; ok && !isNull(raw) {
		var states []map[string]json.RawMessage
		if json.Unmarshal(raw, &states) != nil {
			return nil, fmt.Errorf("reading server info: internal_states is not a list of objects")
		}
		for _, st := range states {
			var mem map[string]json.RawMessage
			if raw, ok := st["memory_usage"]; ok && !isNull(raw) {
				if json.Unmarshal(raw, &mem) != nil {
					return nil, fmt.Errorf("reading server info: internal_states memory_usage is not an object")
				}
			}
			n, err := optInt(mem, "token_capacity", 1, 0)
			if err != nil {
				return nil, fmt.Errorf("reading server info: internal_states: %w", err)
			}
			if n > 0 {
				c.PoolTokens = min(c.PoolTokens, n)
			}
			page, err := optInt(st, "page_size", 1, 0)
			if err != nil {
				return nil, fmt.Errorf("reading server info: internal_states: %w", err)
			}
			c.PageSize = max(c.PageSize, page)
		}
	}
	if c.PageSize >= c.PoolTokens {
		// Not one request could be scheduled: no honest engine starts so.
		return nil, fmt.Errorf("reading server info: page_size %d leaves no room in a pool of %d tokens", c.PageSize, c.PoolTokens)
	}
	var models struct {
		Data []map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(modelsBody, &models); err != nil {
		return nil, fmt.Errorf("reading /v1/models: not a model list")
	}
	if len(models.Data) == 0 {
		return nil, fmt.Errorf("reading /v1/models: no model")
	}
	if c.ContextLen, err = needInt(models.Data[0], "max_model_len", 1); err != nil {
		return nil, fmt.Errorf("reading /v1/models: %w", err)
	}
	for _, m := range models.Data[1:] { // other served names (adapters) share the engine's limits
		n, err := optInt(m, "max_model_len", 1, 0)
		if err != nil {
			return nil, fmt.Errorf("reading /v1/models: %w", err)
		}
		if n > 0 {
			c.ContextLen = min(c.ContextLen, n)
		}
	}
	if ctxFlag > 0 {
		c.ContextLen = min(c.ContextLen, ctxFlag)
	}
	if raw, ok := models.Data[0]["id"]; ok && json.Unmarshal(raw, &c.Model) != nil {
		return nil, fmt.Errorf("reading /v1/models: id is not a string")
	}
	// SGLang derives max_req_input_len = min(context − 1, pool − 1) − 5 and its scheduler
	// rejects P ≥ it; a larger number is a reading that contradicts its own pool or context.
	c.MaxReqInputLen = reportedMRIL
	if derived := DerivedMaxReqInputLen(c.PoolTokens, c.ContextLen); reportedMRIL > derived {
		c.MaxReqInputLen = max(derived, 0)
		c.ReportedMaxReqInputLen = reportedMRIL
	}
	c.ReadAt = time.Now()
	return c, nil
}

// defaultReservedDecodeTokens is SGLang's --num-reserved-decode-tokens default.
const defaultReservedDecodeTokens = 512

// DerivedMaxReqInputLen is SGLang's max_req_input_len for a pool and a context:
// min(context − 1, pool − 1) − 5.
func DerivedMaxReqInputLen(pool, ctx int) int { return min(ctx-1, pool-1) - 5 }

// maxCapacity bounds any size an engine reports (tokens, ports aside): far above any real
// pool or context, and small enough that sums of a few of them cannot overflow.
const maxCapacity = 1 << 40

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// needInt reads obj[name] as a JSON integer from lo to maxCapacity.
func needInt(obj map[string]json.RawMessage, name string, lo int) (int, error) {
	raw, ok := obj[name]
	if !ok || isNull(raw) {
		return 0, fmt.Errorf("%s missing", name)
	}
	return strictInt(raw, name, lo)
}

// optInt is needInt for a field that may be absent or null (then def).
func optInt(obj map[string]json.RawMessage, name string, lo, def int) (int, error) {
	raw, ok := obj[name]
	if !ok || isNull(raw) {
		return def, nil
	}
	return strictInt(raw, name, lo)
}

// strictInt accepts only an integer literal: "4096", never "4096.0", "4e3", "\"4096\"" or true.
// Python's json writes ints that way, so anything else is not an honest engine's number.
func strictInt(raw json.RawMessage, name string, lo int) (int, error) {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is not an integer", name)
	}
	if n < int64(lo) || n > maxCapacity {
		return 0, fmt.Errorf("%s = %d is out of range", name, n)
	}
	return int(n), nil
}

// sumGauge adds up a gauge over its label sets (one per DP rank) in Prometheus text, under
// either spelling of SGLang's prefix (sglang:name or sglang_name).
func sumGauge(text []byte, name string) (int, bool) {
	total, found := 0.0, false
	for _, line := range bytes.Split(text, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("sglang:"+name))
		if !ok {
			if rest, ok = bytes.CutPrefix(line, []byte("sglang_"+name)); !ok {
				continue
			}
		}
		if len(rest) == 0 || (rest[0] != '{' && rest[0] != ' ') {
			continue // a longer name with this one as its prefix
		}
		if i := bytes.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := bytes.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(string(fields[0]), 64)
		if err != nil || !saneCount(v) {
			continue
		}
		total += v
		found = true
	}
	return int(min(total, maxCount)), found
}

// maxCount bounds a used-token count read from an engine; far above any real pool.
const maxCount = 1 << 40

// saneCount: an engine's used-token count must be a finite number from 0 to maxCount. NaN,
// infinities, negative or huge values (which int() turns into the most negative load, making a
// lying engine the least loaded) are ignored.
func saneCount(v float64) bool { return v >= 0 && v <= maxCount }

// sumField adds up every numeric field named name anywhere in a JSON document: /v1/loads has
// one object per DP rank, in shapes that differ between versions.
func sumField(raw json.RawMessage, name string) (int, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return 0, false
	}
	total, found := 0, false
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if f, ok := e.(float64); ok && k == name {
					if saneCount(f) {
						total = min(total+int(f), maxCount)
						found = true
					}
				} else {
					walk(e)
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return total, found
}

// get reads one of the engine's GET endpoints with the backend's key.
func (s *Set) get(b *Backend, path string) ([]byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(b.base + path)
	req.Header.SetMethod(fasthttp.MethodGet)
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
	}
	if err := b.poll.DoTimeout(req, resp, s.opts.PollTimeout); err != nil {
		return nil, err
	}
	switch code := resp.StatusCode(); {
	case code == fasthttp.StatusNotFound:
		return nil, errNotFound
	case code != fasthttp.StatusOK:
		return nil, fmt.Errorf("%s answered %d", path, code)
	}
	return append([]byte(nil), resp.Body()...), nil
}

func (s *Set) getJSON(b *Backend, path string, out any) error {
	body, err := s.get(b, path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Route is one way to serve a request: Unified alone, or Prefill with Decode.
type Route struct {
	policy.Path
	Unified, Prefill, Decode *Backend
}

// All are the route's backends (one, or prefill then decode).
func (r *Route) All() []*Backend {
	if r.Unified != nil {
		return []*Backend{r.Unified}
	}
	return []*Backend{r.Prefill, r.Decode}
}

// Load is the route's current load in tokens: what the engines report in use plus what this
// gateway has in flight to them.
func (r *Route) Load() int64 {
	var n int64
	for _, b := range []*Backend{r.Unified, r.Prefill, r.Decode} {
		if b == nil {
			continue
		}
		n += b.inflight.Load()
		if c := b.Capacity(); c != nil && c.UsedTokens > 0 {
			n += int64(c.UsedTokens)
		}
	}
	return n
}

// kvNeeds is what a request of prompt and output tokens holds on each backend of the route: a
// prefill engine holds the prompt, a decode or unified one the prompt and the output, each cut
// to the engine's pool. The cut is the physical bound, not a leniency: admission refused every
// prompt over the pool, and SGLang cuts max_new_tokens to its max_req_len − prompt − 1 (below
// the pool), so a prompt + max_tokens over the pool is served, ending at the pool. Such a
// request books the whole pool; the admission queue keeps it from blocking the others
// (fairqueue: a large head is passed and charged its whole booking), so it is not refused.
func (r *Route) kvNeeds(prompt, output int) (bs [2]*Backend, need [2]int64, n int) {
	add := func(b *Backend, tokens int) {
		if c := b.Capacity(); c != nil {
			tokens = min(tokens, c.PoolTokens)
		}
		bs[n], need[n] = b, int64(tokens)
		n++
	}
	if r.Unified != nil {
		add(r.Unified, prompt+output)
		return
	}
	add(r.Prefill, prompt)
	add(r.Decode, prompt+output)
	return
}

// KVNeed is what the request books on the route's backend it fills the most, and that backend's
// pool (0 when unknown): the admission queue's ticket (fairqueue.Ticket's Tokens and Pool).
func (r *Route) KVNeed(prompt, output int) (need, pool int64) {
	bs, needs, n := r.kvNeeds(prompt, output)
	for i := 0; i < n; i++ {
		c := bs[i].Capacity()
		if c == nil || c.PoolTokens <= 0 {
			need = max(need, needs[i]) // unknown pool: the need as asked, nothing large
			continue
		}
		p := int64(c.PoolTokens)
		if pool == 0 || needs[i]*pool > need*p { // needs[i]/p > need/pool, without division
			need, pool = needs[i], p
		}
	}
	return need, pool
}

// Reserve takes the request's KV on every backend of the route when each one's KVFree holds it,
// and reports whether it did. Unknown usage fails closed (false). The caller serialises
// Reserve calls for a route's backends (one admission queue per model) and calls Unreserve with
// the same numbers when the request finishes.
func (r *Route) Reserve(prompt, output int) bool {
	bs, need, n := r.kvNeeds(prompt, output)
	for i := 0; i < n; i++ {
		if free, known := bs[i].KVFree(); !known || free < need[i] {
			return false
		}
	}
	for i := 0; i < n; i++ {
		bs[i].reserved.Add(need[i])
	}
	return true
}

// Unreserve releases what Reserve took.
func (r *Route) Unreserve(prompt, output int) {
	bs, need, n := r.kvNeeds(prompt, output)
	for i := 0; i < n; i++ {
		bs[i].reserved.Add(-need[i])
	}
}

// Reasons no route is available.
var (
	ErrCapacityUnknown = errors.New("capacity_unknown")
	ErrNoBackend       = errors.New("no_backend")
)

// usable says whether b can take traffic now, and if not whether that is because its capacity
// is unknown (never read, or older than MaxAge) rather than it being down or excluded.
func (s *Set) usable(b *Backend, now time.Time) (ok, unknown bool) {
	if until := b.quarantinedUntil.Load(); until > 0 && now.UnixNano() < until {
		return false, false
	}
	c := b.capacity.Load()
	if c == nil || now.Sub(c.ReadAt) > s.opts.MaxAge {
		return false, b.LastError() == ""
	}
	if b.LastError() != "" || !b.roleOK.Load() {
		return false, false
	}
	return true, false
}

// Routes lists every route that can take traffic now, over every model. With none, the error
// says why: ErrCapacityUnknown (fail closed: nothing fresh to check against) or ErrNoBackend.
func (s *Set) Routes(now time.Time) ([]Route, error) {
	return s.routes(now, func(*Backend) bool { return true })
}

// RoutesFor is Routes for the engines configured to serve model.
func (s *Set) RoutesFor(model string, now time.Time) ([]Route, error) {
	return s.routes(now, func(b *Backend) bool { return b.Model == model })
}

// routes builds the routes over the usable backends that keep says. A prefill pairs only with
// the decodes of its model and group: another model's decode would generate from a KV cache it
// cannot read.
func (s *Set) routes(now time.Time, keep func(*Backend) bool) ([]Route, error) {
	var unified, prefill, decode []*Backend
	unknown := false
	for _, b := range s.members() {
		if !keep(b) {
			continue
		}
		ok, unk := s.usable(b, now)
		unknown = unknown || unk
		if !ok {
			continue
		}
		switch b.Role {
		case config.RoleUnified:
			unified = append(unified, b)
		case config.RolePrefill:
			prefill = append(prefill, b)
		case config.RoleDecode:
			decode = append(decode, b)
		}
	}
	var routes []Route
	for _, u := range unified {
		c := u.Capacity()
		routes = append(routes, Route{Path: policy.Path{Backends: u.names, MaxReqInputLen: c.MaxReqInputLen,
			ContextLen: c.ContextLen, PoolTokens: c.PoolTokens, PageSize: c.PageSize}, Unified: u})
	}
	for _, p := range prefill {
		for _, d := range decode {
			if p.Model != d.Model || p.Group != d.Group {
				continue
			}
			pc, dc := p.Capacity(), d.Capacity()
			routes = append(routes, Route{
				Path: policy.Path{Backends: []string{p.Name, d.Name},
					MaxReqInputLen: min(pc.MaxReqInputLen, dc.MaxReqInputLen), ContextLen: min(pc.ContextLen, dc.ContextLen),
					// The smaller pool with the larger page: never above either side's edge.
					PoolTokens: min(pc.PoolTokens, dc.PoolTokens), PageSize: max(pc.PageSize, dc.PageSize),
					DecodePool: dc.PoolTokens, DecodeReserve: dc.ReservedDecodeTokens},
				Prefill: p, Decode: d,
			})
		}
	}
	if len(routes) == 0 {
		if unknown {
			return nil, ErrCapacityUnknown
		}
		return nil, ErrNoBackend
	}
	return routes, nil
}

// Unavailable says why no route can take traffic now ("" when one can): how many backends are
// quarantined, down, reporting another role than configured, or without fresh capacity, and
// which roles are usable when a prefill/decode pair is missing its other half. Counts only, no
// names or addresses: /readyz is not behind the admin key.
func (s *Set) Unavailable(now time.Time) string {
	if _, err := s.Routes(now); err == nil {
		return ""
	}
	var quarantined, down, wrongRole, unknown int
	usable := map[config.Role]int{}
	all := s.All()
	for _, b := range all {
		switch c := b.capacity.Load(); {
		case b.quarantinedUntil.Load() > now.UnixNano():
			quarantined++
		case b.LastError() != "":
			down++
		case c == nil || now.Sub(c.ReadAt) > s.opts.MaxAge:
			unknown++
		case !b.roleOK.Load():
			wrongRole++
		default:
			usable[b.Role]++
		}
	}
	var parts []string
	for _, p := range []struct {
		n    int
		what string
	}{{quarantined, "quarantined"}, {down, "down"}, {wrongRole, "reporting another role than configured"}, {unknown, "without a fresh capacity reading"}} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	if usable[config.RolePrefill]+usable[config.RoleDecode] > 0 {
		parts = append(parts, fmt.Sprintf("usable: %d prefill and %d decode, no pair", usable[config.RolePrefill], usable[config.RoleDecode]))
	}
	return fmt.Sprintf("no backend can take traffic (%d configured: %s)", len(all), strings.Join(parts, ", "))
}

// SetQuarantine applies the quarantine state (state.Quarantines, its one owner, alone calls it):
// backends named in until are out of rotation until then; the others are released.
func (s *Set) SetQuarantine(until map[string]time.Time) {
	s.mu.Lock()
	s.quarantine = until // for members that join later
	s.mu.Unlock()
	for _, b := range s.All() {
		if t, ok := until[b.Name]; ok {
			b.quarantinedUntil.Store(t.UnixNano())
		} else {
			b.quarantinedUntil.Store(0)
		}
	}
}

// Usable reports whether b can take traffic now.
func (s *Set) Usable(b *Backend, now time.Time) bool {
	ok, _ := s.usable(b, now)
	return ok
}

// SetCapacityForTest installs a reading, as a successful poll with the right role would, without
// any network (tests and benchmarks in other packages).
func SetCapacityForTest(b *Backend, c *Capacity) {
	b.capacity.Store(c)
	b.roleOK.Store(true)
	b.lastErr.Store(nil)
	b.polled.Store(true)
}
