// Package config owns the Config type: it loads YAML, applies KVGATE_* environment overrides,
// fills defaults and validates, with errors that name the offending field. It is pure: it opens
// no sockets and starts nothing.
package config

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"
)

// Config is the whole gateway configuration. Zero values mean "use the default" unless a field's
// doc says otherwise.
type Config struct {
	// Listen is the gateway's address. Default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// AdminKeySHA256 is the hex SHA-256 of the admin key; empty disables the admin routes.
	AdminKeySHA256 string `yaml:"admin_key_sha256"`
	// MaxBodyBytes caps request bodies; larger ones get 413 request_too_large. Default 32 MiB.
	MaxBodyBytes int `yaml:"max_body_bytes"`

	Backends []Backend `yaml:"backends"`
	// Models names the models backends serve, their aliases and per-model settings. Optional:
	// without it the backends' `model` values are the models, with the top-level settings; with
	// it, every backend's `model` must be listed (a typo is an error, not a new model). With no
	// model anywhere the gateway fronts one model (whatever its engines serve).
	Models    []Model   `yaml:"models"`
	Tenants   []Tenant  `yaml:"tenants"`
	Discovery Discovery `yaml:"discovery"`
	Reload    Reload    `yaml:"reload"`
	Policy    Policy    `yaml:"policy"`
	Tokenizer Tokenizer `yaml:"tokenizer"`
	State     State     `yaml:"state"`
	Canary    Canary    `yaml:"canary"`
	Capacity  Capacity  `yaml:"capacity"`
	Upstream  Upstream  `yaml:"upstream"`
	Limits    Limits    `yaml:"limits"`
	Server    Server    `yaml:"server"`
	Queue     Queue     `yaml:"queue"`
}

// Queue is admission at the live free KV: a request that fits the pool but not what is free now
// waits, and waiting tenants are served by fair share. Off by default in this release: it
// needs engines that report their KV usage (/v1/loads, or the num_used_tokens gauge), since
// unknown usage fails closed, and its sharing across replicas is not built yet (each replica
// sees only its own dispatches between polls).
type Queue struct {
	Enabled bool `yaml:"enabled"`
	// Policy is fair (token-weighted fair share, the default) or round_robin (one request per
	// waiting tenant in turn, whatever its size).
	Policy QueuePolicy `yaml:"policy"`
	// Timeout bounds a request's wait; past it the client gets 429 with Retry-After. Default 30s.
	Timeout time.Duration `yaml:"timeout"`
	// MaxQueued bounds the requests waiting per model; beyond it 503 at once. Default 1024.
	MaxQueued int `yaml:"max_queued"`
}

// QueuePolicy is queue.policy.
type QueuePolicy string

const (
	QueueFair       QueuePolicy = "fair"
	QueueRoundRobin QueuePolicy = "round_robin"
)

// Server bounds what one client connection may cost the gateway before a request is admitted:
// how long it may take to send its headers and body, how large its headers may be, and how many
// connections it may hold.
type Server struct {
	// HeaderTimeout bounds the wait for a request's headers, from the connection's first byte
	// (or its opening). A client that dribbles headers is cut off with 408. Default 10s.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// ReadTimeout bounds reading a request body once its headers are in. Replies are not bound
	// by it (streams may run for minutes). Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes a keep-alive connection that sends no next request for this long.
	// Default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes caps the request line plus headers; larger get 431. It is also each client
	// connection's read buffer, so it costs memory per connection. Default 8192.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxConns caps concurrent client connections (beyond it new ones get 503 and are closed).
	// Default 65536.
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerIP caps concurrent connections from one client address; 0 (default) is no
	// limit, since behind a load balancer every client shares its address.
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
	// MetricsListen, when set, serves /metrics on this address only (a private network or
	// loopback for the scraper), and the main listener answers 404 there. Default "": /metrics
	// on the main listener.
	MetricsListen string `yaml:"metrics_listen"`
	// MetricsAuth says who may read /metrics (wherever it is served), which names every tenant
	// and backend with their token volumes. key (default): a bearer token whose SHA-256 is
	// MetricsKeySHA256, or the admin key; with neither configured /metrics answers 401 and the
	// start warns. admin: the admin key only. none: anyone who reaches the listener (an explicit
	// choice: it exposes tenant names).
	MetricsAuth MetricsAuth `yaml:"metrics_auth"`
	// MetricsKeySHA256 is the hex SHA-256 of the scrape key that reads /metrics under
	// metrics_auth key: a credential for the scraper that opens no admin route.
	MetricsKeySHA256 string `yaml:"metrics_key_sha256"`
	// AuthThrottle slows down guessing of the admin and metrics keys, per client address.
	AuthThrottle AuthThrottle `yaml:"auth_throttle"`
	// DrainDelay is the first phase of a shutdown (SIGTERM or SIGINT): /readyz answers 503
	// draining at once while requests are still served and new connections still accepted, so
	// load balancers have time to move traffic away. 0 skips it. Default 5s.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// DrainTimeout is the second phase: the listener closes and requests in flight may finish
	// for this long. A stream still open at the deadline ends with an error event (and an access
	// line), then the process exits 0; 0 cuts at once. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// AuthThrottle is the per-client-address backoff and lockout after failed admin or metrics
// keys (the status page's login, a bearer key on /admin/ or /metrics). The address is the
// connection's own: behind a proxy every client shares the proxy's, and one guesser can lock
// them all out for Lockout (X-Forwarded-For is not trusted). Each replica counts alone.
type AuthThrottle struct {
	// FreeFailures is how many failures one address gets answered before it must wait.
	// Default 5.
	FreeFailures int `yaml:"free_failures"`
	// Backoff is the wait after failure FreeFailures, doubled after each further one (a
	// request while it lasts is a 429 with Retry-After, and its key is not checked).
	// Default 1s.
	Backoff time.Duration `yaml:"backoff"`
	// LockoutAfter failures lock the address out for Lockout. Default 10.
	LockoutAfter int `yaml:"lockout_after"`
	// Lockout is how long a locked-out address waits, and how long an address's failures are
	// remembered after its last one. Default 15m.
	Lockout time.Duration `yaml:"lockout"`
	// MaxAddresses bounds the table of addresses with failures (about 100 bytes each); once it
	// is full, addresses not in it share one entry, so guessing from many addresses is throttled
	// as one. IPv6 addresses count by their /64. Default 10000.
	MaxAddresses int `yaml:"max_addresses"`
}

// Drain defaults: set before decoding, since 0 is a meaningful choice for both.
const (
	defaultDrainDelay   = 5 * time.Second
	defaultDrainTimeout = 30 * time.Second
)

// MinCanarySecretBytes is the shortest canary.secret accepted: markers are an HMAC under it, and
// a short secret can be guessed from the markers a tenant sees in its own prompts. 32 bytes of a
// random secret are the 256 bits of the HMAC-SHA256 it keys.
const MinCanarySecretBytes = 32

// Backend is one engine server.
type Backend struct {
	Name string `yaml:"name"`
	// URL is the engine's address: http://host[:port] or https://host[:port] (default ports 80
	// and 443), with no path: kvgate calls the engine's own paths (/generate, /server_info,
	// /v1/chat/completions…) at its root.
	URL string `yaml:"url"`
	// TLS configures an https:// URL's connection; it is refused on an http:// one.
	TLS BackendTLS `yaml:"tls"`
	// Model is the model this engine serves, as clients name it in a request's "model"; once
	// one backend names a model, every backend must. Requests go only to their model's engines.
	Model string `yaml:"model"`
	// Discover is "" (the URL is one engine) or dns: the URL's host is resolved every
	// discovery.interval and each address is a backend of its own, named name@address, with the
	// entry's role, model, group, key and TLS (an https member's certificate must carry the
	// host's name, or tls.server_name).
	Discover string `yaml:"discover"`
	// Group, when set, narrows PD pairing further: a prefill pairs only with decodes of its
	// model and its group (engines that can reach each other's KV transfer).
	Group string `yaml:"group"`
	// Role is unified (SGLang's disaggregation_mode "null"), prefill or decode.
	Role Role `yaml:"role"`
	// APIKey is sent to the engine as a bearer token; the client's own key never is.
	APIKey string `yaml:"api_key"`
}

// Reload configures how `kvgate serve` picks up a changed file (SIGHUP always reloads).
type Reload struct {
	// Watch reloads when the configuration file changes (its directory is watched).
	Watch bool `yaml:"watch"`
}

// Discovery configures how backends with discover: dns find their members.
type Discovery struct {
	// Interval is how often each discovered host is resolved again. Default 10s.
	Interval time.Duration `yaml:"interval"`
	// Resolver is a DNS server (host:port) asked instead of the system's resolver.
	Resolver string `yaml:"resolver"`
}

// Model is one model the gateway serves.
type Model struct {
	// Name is the model's id (in /v1/models and in requests); the backends that serve it name it
	// in their `model`.
	Name string `yaml:"name"`
	// Aliases are other ids requests may use for it (listed in /v1/models under the name).
	Aliases []string `yaml:"aliases"`
	// Tokenizer overrides the top-level tokenizer for this model's estimates; unset fields take
	// the top-level values. Nil: the top-level tokenizer.
	Tokenizer *Tokenizer `yaml:"tokenizer"`
}

// MultiModel reports whether requests are routed by model: some backend or models[] names one.
func (c *Config) MultiModel() bool {
	if len(c.Models) > 0 {
		return true
	}
	for _, b := range c.Backends {
		if b.Model != "" {
			return true
		}
	}
	return false
}

// ModelNames lists the served models in order: models[] first, then any model only backends
// name. Empty when MultiModel is false.
func (c *Config) ModelNames() []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range c.Models {
		if !seen[m.Name] {
			seen[m.Name] = true
			out = append(out, m.Name)
		}
	}
	for _, b := range c.Backends {
		if b.Model != "" && !seen[b.Model] {
			seen[b.Model] = true
			out = append(out, b.Model)
		}
	}
	return out
}

// ModelTokenizer is the tokenizer settings of model: its own over the top-level ones.
func (c *Config) ModelTokenizer(model string) Tokenizer {
	for _, m := range c.Models {
		if m.Name == model && m.Tokenizer != nil {
			return *m.Tokenizer
		}
	}
	return c.Tokenizer
}

// fillZero sets every zero field of dst to src's (the same struct type): a model's tokenizer
// inherits whatever it does not set, whatever fields the type gains.
func fillZero(dst, src reflect.Value) {
	for i := 0; i < dst.NumField(); i++ {
		if f := dst.Field(i); f.CanSet() && f.IsZero() {
			f.Set(src.Field(i))
		}
	}
}

// BackendTLS is how kvgate verifies an https:// engine and proves itself to it. There is no
// option to skip verification and no plaintext fallback: a handshake that fails is a backend
// that is down.
type BackendTLS struct {
	// CAFile is a PEM file of the CAs that sign the engine's certificate; empty: the system's
	// roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and its key, for engines that require
	// one (mutual TLS); both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the engine's certificate must carry (and the SNI sent), when it
	// differs from the URL's host (an engine reached by address).
	ServerName string `yaml:"server_name"`
}

// IsZero reports that no TLS setting is given.
func (t BackendTLS) IsZero() bool { return t == BackendTLS{} }

// ClientConfig reads the files t names into the TLS configuration of a connection to an engine:
// TLS 1.2 at least, the certificate verified against CAFile (or the system's roots) for
// ServerName (or the URL's host, which the HTTP client fills in).
func (t BackendTLS) ClientConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: %s holds no PEM certificate", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("cert_file and key_file go together (a client certificate needs its key)")
	}
	if t.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file/key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// Address is the backend URL's scheme and host:port (the default port made explicit), checked:
// http or https, a host, and nothing else (no path, query, fragment or credentials).
func (b Backend) Address() (scheme, hostPort string, err error) {
	u, err := neturl.Parse(b.URL)
	if err != nil {
		return "", "", fmt.Errorf("must be http://host:port or https://host:port, got %q", b.URL)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", fmt.Errorf("must be http://host:port or https://host:port, got %q", b.URL)
	}
	if u.Hostname() == "" || u.Opaque != "" {
		return "", "", fmt.Errorf("needs a host (http://host:port), got %q", b.URL)
	}
	if u.Path != "" && u.Path != "/" {
		return "", "", fmt.Errorf("must not have a path (kvgate calls the engine's own paths, /generate, /server_info, /v1/chat/completions…, at its root; a base path is not supported), got path %q in %q", u.Path, b.URL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("must not carry a query, fragment or credentials (use api_key), got %q", b.URL)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("port must be 1-65535, got %q", port)
	}
	return u.Scheme, net.JoinHostPort(u.Hostname(), port), nil
}

// Tenant is one API customer: the one record of a tenant, whether it comes from the file
// (yaml) or is added at run time (the admin API's JSON body, the shared store's record), so an
// attribute added here reaches every tenant. Its attributes are checked by Check.
type Tenant struct {
	Name string `yaml:"name" json:"name"`
	// KeySHA256 is the hex SHA-256 of the tenant's API key; the key itself is never stored.
	KeySHA256 string `yaml:"key_sha256" json:"key_sha256"`
	// MaxPromptTokens caps the prompt (after template and canary); 0 means no cap.
	MaxPromptTokens int `yaml:"max_prompt_tokens" json:"max_prompt_tokens"`
	// MaxPromptBytes caps a prompt's size in bytes, as the client sent it (before template and
	// canary): a request over it is refused with 413 before any token is counted, so a tenant's
	// oversized prompts cost no counting. 0 means no cap.
	MaxPromptBytes int `yaml:"max_prompt_bytes" json:"max_prompt_bytes"`
	// CanaryOptOut disables marker injection for this tenant (its replies are still scanned).
	CanaryOptOut bool `yaml:"canary_opt_out" json:"canary_opt_out"`
	// RPM caps requests per minute, across every replica; 0 means no limit. Burst = RPM.
	RPM int `yaml:"rpm" json:"rpm"`
	// TPM caps tokens per minute (prompt + reserved output, settled from the reply's usage);
	// 0 means no limit. Burst = TPM.
	TPM int `yaml:"tpm" json:"tpm"`
	// MaxConcurrent caps requests in flight, across every replica; 0 means no limit.
	MaxConcurrent int `yaml:"max_concurrent" json:"max_concurrent"`
	// Weight is the tenant's share of a model's KV when the admission queue (queue.enabled)
	// holds requests: a tenant of weight 2 is served twice the tokens of one of weight 1.
	// Default 1.
	Weight float64 `yaml:"weight" json:"weight"`
}

// SetDefaults fills what an absent attribute means: weight 1 (also for a run-time record
// written before weights existed).
func (t *Tenant) SetDefaults() {
	if t.Weight == 0 {
		t.Weight = 1
	}
}

// Check reports each attribute of t that is out of range: bad gets the attribute's name (as the
// file and the admin API spell it) and what is wrong. The name's rules are the caller's (the file
// and the admin API differ).
func (t *Tenant) Check(bad func(field, format string, args ...any)) {
	if !isSHA256Hex(t.KeySHA256) {
		bad("key_sha256", "must be 64 hex characters (the SHA-256 of the tenant's API key)")
	}
	for _, l := range []struct {
		name string
		v    int
		zero string
	}{{"max_prompt_tokens", t.MaxPromptTokens, "no cap"}, {"max_prompt_bytes", t.MaxPromptBytes, "no cap"},
		{"rpm", t.RPM, "no limit"}, {"tpm", t.TPM, "no limit"}, {"max_concurrent", t.MaxConcurrent, "no limit"}} {
		if l.v < 0 {
			bad(l.name, "must be ≥ 0 (0 = %s), got %d", l.zero, l.v)
		}
	}
	if !(t.Weight > 0 && t.Weight <= 1000) { // NaN fails too
		bad("weight", "must be > 0 and ≤ 1000, got %v", t.Weight)
	}
}

// IsolationPolicy is policy.isolation.
type IsolationPolicy struct {
	// RefuseShared keeps tenants' traffic off a backend whose last salt verdict is shared
	// (fail closed: 503 when no path is left). Off by default.
	RefuseShared bool `yaml:"refuse_shared"`
}

// Policy is the admission policy.
type Policy struct {
	// Mode is enforce (default) or monitor (the token rule is logged, not enforced).
	Mode Mode `yaml:"mode"`
	// Strict refuses to start when a backend's KV pool is smaller than its context, or than its
	// own max_req_input_len (an inconsistent reading).
	Strict bool `yaml:"strict"`
	// DefaultMaxTokens is the output reserved for OpenAI routes that name none; 0 reserves none.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// AllowStoredContext lets /v1/responses requests that extend stored state the gateway cannot
	// see (previous_response_id, conversation) through; their count is then only a lower bound.
	AllowStoredContext bool `yaml:"allow_stored_context"`
	// SharePrefixCache stops the gateway from setting a per-tenant cache_salt, so tenants may
	// share prefix-cache entries (faster, and a cross-tenant timing channel).
	SharePrefixCache bool `yaml:"share_prefix_cache"`
	// Isolation routes on the backends' salt verdicts (`kvgate audit`): policy.Isolation.
	Isolation IsolationPolicy `yaml:"isolation"`
	// OverflowStatus is the status of a prompt the engines cannot take (code
	// context_length_exceeded): 413 (default) or 400, for clients that handle OpenAI's
	// context_length_exceeded only as the 400 OpenAI itself answers.
	OverflowStatus int `yaml:"overflow_status"`
	// CountDrift is the drift monitor: replies whose engine counted more prompt tokens than the
	// bound admission used make the model's admission fail-closed.
	CountDrift CountDrift `yaml:"count_drift"`
}

// CountDrift: Threshold drifts of one model within Window make its admission fail-closed (an
// exact count required; without one, 503 with Retry-After) until an operator clears it.
type CountDrift struct {
	// Threshold is how many replies of one model, within Window, must show the engine counting
	// more than the admitted bound. Default 3; at least 1.
	Threshold int `yaml:"threshold"`
	// Window is the span the drifts are counted over. Default 10m; from 1s to 24h.
	Window time.Duration `yaml:"window"`
}

// Tokenizer selects the estimator used when the byte bound cannot decide.
type Tokenizer struct {
	// Library is kvgate (default: kvgate's own exact counter over tiktoken-go's vocabularies) or
	// tiktoken-go (github.com/tiktoken-go/tokenizer's Count; slower, the same counts but on some
	// whitespace runs).
	Library Library `yaml:"library"`
	// Encoding is cl100k_base (default) or o200k_base.
	Encoding string `yaml:"encoding"`
	// HFDir, when set, is a directory holding the served model's tokenizer.json and
	// tokenizer_config.json: prompts are then rendered with its chat_template and counted with its
	// own tokenizer, exactly and locally (no safety ratio, no calibration, no /tokenize call), and
	// Library, Encoding and the ratio settings are not used.
	HFDir string `yaml:"hf_dir"`
	// RemoteImages is what happens to an image given by an http(s) URL, which the gateway does
	// not fetch (so cannot size): refuse (default: 400 naming the part) or count_max (counted
	// as the largest image the model's processor makes, from its preprocessor_config.json).
	// Images sent as base64 data are read and counted whatever this says.
	RemoteImages RemoteImages `yaml:"remote_images"`
	// SafetyRatio r: estimate×r must fit to admit without an exact count. Default 1.3, ≥ 1.
	SafetyRatio float64 `yaml:"safety_ratio"`
	// SafetyRatioMax caps how far engine reports may raise r. Default 2.0.
	SafetyRatioMax float64 `yaml:"safety_ratio_max"`
	// ExactConcurrency bounds concurrent /tokenize calls to engines. Default 4; 0 uses the default.
	ExactConcurrency int `yaml:"exact_concurrency"`
	// ExactTimeout bounds one /tokenize call. Default 2s.
	ExactTimeout time.Duration `yaml:"exact_timeout"`
	// CalibrationRetryMax caps the backoff between attempts to calibrate an engine whose
	// /tokenize failed or answered implausibly (first retry after one capacity.poll_interval,
	// doubling). Until one succeeds, estimates for paths through that engine are refuse-only.
	// Default 30s.
	CalibrationRetryMax time.Duration `yaml:"calibration_retry_max"`
}

// CheckHFDir says what is wrong with a tokenizer.hf_dir value ("" is unset, and fine): the
// directory must hold tokenizer.json and tokenizer_config.json. Whether the tokenizer inside is
// supported is known only when it is loaded (gateway.New names this key then too).
func CheckHFDir(dir string) error {
	if dir == "" {
		return nil
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("%s must hold %s: %v", dir, f, err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s/%s is not a regular file", dir, f)
		}
	}
	return nil
}

// State says where shared state lives.
type State struct {
	// RedisURL empty keeps all state in memory (one replica).
	RedisURL string `yaml:"redis_url"`
	// RedisMode is standalone (default), sentinel or cluster.
	RedisMode RedisMode `yaml:"redis_mode"`
	// KeyPrefix prefixes every Redis key. Default "kvgate:".
	KeyPrefix string `yaml:"key_prefix"`
}

// Canary configures marker injection and reply scanning.
type Canary struct {
	Enabled bool `yaml:"enabled"`
	// Secret derives markers; required when enabled. KVGATE_CANARY_SECRET overrides it.
	Secret string `yaml:"secret"`
	// Epoch is how often markers rotate. Default 1h.
	Epoch time.Duration `yaml:"epoch"`
	// DetectWindow is how long an old marker stays detectable. Default 24h.
	DetectWindow time.Duration `yaml:"detect_window"`
	// EveryBytes repeats the marker every N bytes of prompt; 0 injects once.
	EveryBytes int `yaml:"every_bytes"`
	// Placement is system_end (default) or prefix.
	Placement Placement `yaml:"placement"`
	// QuarantineTTL is how long a backend that leaked stays out of rotation. Default 15m.
	QuarantineTTL time.Duration `yaml:"quarantine_ttl"`
	// IncidentContext keeps up to 200 bytes of reply text around a marker hit in the incident
	// (markers redacted). Default false: incidents hold tenants, hashes, offsets and lengths only,
	// since the record of a leak would otherwise be a copy of the leaked text.
	IncidentContext bool `yaml:"incident_context"`
	// IncidentTTL is how long incidents are kept (memory and Redis). Default 168h.
	IncidentTTL time.Duration `yaml:"incident_ttl"`
	// Fingerprints detects another tenant's prompt text in a reply (package fingerprint).
	Fingerprints Fingerprints `yaml:"fingerprints"`
}

// Fingerprints configures prompt-text leak detection; on whenever canaries are, unless Off.
type Fingerprints struct {
	// Off turns prompt fingerprints off (markers still work).
	Off bool `yaml:"off"`
	// MaxBytes caps this replica's fingerprint index; the oldest prompts go first. Default 64 MiB.
	MaxBytes int64 `yaml:"max_bytes"`
	// CutMatches distinct foreign fingerprints in a reply are a text match (cut, incident);
	// fewer are counted only. Default 3.
	CutMatches int `yaml:"cut_matches"`
	// Mode is enforce (default: a text match cuts the reply) or monitor (the reply is passed
	// on and the incident recorded as flagged; never a quarantine).
	Mode Mode `yaml:"mode"`
	// A text match alone quarantines nothing: matches on one backend from at least
	// CorroborationTenants requesters against at least CorroborationTenants victims within
	// CorroborationWindow do (shared by replicas through the state store). Defaults 1h and 2.
	CorroborationWindow  time.Duration `yaml:"corroboration_window"`
	CorroborationTenants int           `yaml:"corroboration_tenants"`
	// QuarantinesPerRequester bounds the quarantines one requester's text matches trigger per
	// corroboration window. Default 1.
	QuarantinesPerRequester int `yaml:"quarantines_per_requester"`
	// CommonTenants: text this many distinct tenants sent is boilerplate, never evidence.
	// Default 3.
	CommonTenants int `yaml:"common_tenants"`
	// ReplicaLocal keeps fingerprints on the replica that forwarded the prompt. Default false:
	// with Redis state, replicas share them (a stream of keyed hashes, no text), so a leak is
	// caught whichever replica serves the reply.
	ReplicaLocal bool `yaml:"replica_local"`
}

// Capacity configures how engine capacity is read.
type Capacity struct {
	// PollInterval is how often each backend's /server_info and /v1/models are read. Default 2s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxAge: a capacity reading older than this is unknown (fail closed, 503). Default 3×poll.
	MaxAge time.Duration `yaml:"max_age"`
	// Timeout bounds one poll request. Default 2s.
	Timeout time.Duration `yaml:"timeout"`
}

// Upstream configures the proxy's connections to engines.
type Upstream struct {
	// ResponseHeaderTimeout bounds the wait for an engine's first response byte. Default 300s
	// (a long prefill is slow to start).
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout"`
	// IdleTimeout closes a stream that sends nothing for this long. Default 60s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConns per backend; every open stream holds one. Default 4096.
	MaxConns int `yaml:"max_conns"`
	// Retries of a PD request on 408/429/5xx before any byte reached the client. Default 1.
	Retries int `yaml:"retries"`
	// MaxEventBytes caps one event of an engine's stream: an engine that never ends an event
	// gets its stream cut, not buffered whole. Default 4 MiB.
	MaxEventBytes int `yaml:"max_event_bytes"`
	// MaxReplyBytes caps one non-streaming reply (after its content encoding is undone), which
	// is buffered whole to be scanned before the client gets any of it; a larger reply is a 502.
	// Default 64 MiB.
	MaxReplyBytes int `yaml:"max_reply_bytes"`
	// MaxBufferedBytes bounds the memory all non-streaming replies in flight together may hold
	// while they are read, decoded, scanned and re-serialised (each is charged what those steps
	// really allocate, about three times its size, until the garbage collection after it has
	// run). A reply that does not fit gets 503 with Retry-After and its engine request is
	// aborted; nothing else is affected. Must be ≥ 3 × max_reply_bytes, so that a reply of the
	// largest size can be served at all. Default 256 MiB.
	MaxBufferedBytes int64 `yaml:"max_buffered_bytes"`
}

// ReplyCostFactor is how many times its size a typical buffered reply costs while it is held
// (read, decoded, re-serialised); upstream.max_buffered_bytes must hold one reply of
// upstream.max_reply_bytes at this cost.
const ReplyCostFactor = 3

// Limits configures how per-tenant limits are shared between replicas.
type Limits struct {
	// Replicas is how many gateway replicas share the limits. While Redis is unreachable each
	// replica enforces limit / replicas on its own (the larger of this and the count discovered
	// from the replicas' heartbeats). Default 1.
	Replicas int `yaml:"replicas"`
	// RedisTimeout bounds every limiter call to Redis; past it the request is decided locally.
	// Default 100ms.
	RedisTimeout time.Duration `yaml:"redis_timeout"`
}

// The enumerated values: each has its type, and code compares against these constants only.
type (
	// Role is a backend's place in serving: SGLang's disaggregation_mode "null" is unified.
	Role string
	// Mode is policy.mode.
	Mode string
	// MetricsAuth is server.metrics_auth.
	MetricsAuth string
	// RemoteImages is tokenizer.remote_images.
	RemoteImages string
	// Library is tokenizer.library.
	Library string
	// RedisMode is state.redis_mode.
	RedisMode string
	// Placement is canary.placement.
	Placement string
)

const (
	RoleUnified Role = "unified"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"

	ModeEnforce Mode = "enforce"
	ModeMonitor Mode = "monitor"

	LibraryTiktokenGo Library = "tiktoken-go"
	// LibraryKvgate is kvgate's own counting-only BPE (tokenize/bpe) over the same vocabularies.
	LibraryKvgate Library = "kvgate"

	RemoteImagesRefuse   RemoteImages = "refuse"
	RemoteImagesCountMax RemoteImages = "count_max"

	RedisStandalone RedisMode = "standalone"
	RedisSentinel   RedisMode = "sentinel"
	RedisCluster    RedisMode = "cluster"

	PlacementSystemEnd Placement = "system_end"
	PlacementPrefix    Placement = "prefix"

	MetricsAuthKey   MetricsAuth = "key"
	MetricsAuthAdmin MetricsAuth = "admin"
	MetricsAuthNone  MetricsAuth = "none"
)

// defaultRetries is upstream.retries when the file does not name it (0 is a valid choice).
const defaultRetries = 1

// Load reads path, applies env overrides from environ (os.Environ() form), defaults, validates.
func Load(path string, environ []string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return Parse(raw, environ)
}

// Parse is Load without the file: YAML bytes in, validated Config out.
func Parse(raw []byte, environ []string) (*Config, error) {
	var c Config
	// Set before decoding, so that an explicit 0 in the file or the environment stands.
	c.Upstream.Retries = defaultRetries
	c.Server.DrainDelay, c.Server.DrainTimeout = defaultDrainDelay, defaultDrainTimeout
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil {
		return nil, fmt.Errorf("config: %w", err) // not YAML at all: yaml.v3 names the line
	}
	var fileErrs []fileError
	if len(root.Content) > 0 {
		// Unknown keys and ill-typed values are named by path and taken out of the tree, so the
		// decode succeeds and the rest of the file is still checked in this run.
		fileErrs = checkTree(root.Content[0], reflect.TypeOf(c), "")
		if err := root.Content[0].Decode(&c); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	// File, environment and validation errors are reported together: one run names every bad key.
	envErr := ApplyEnv(&c, environ)
	c.applyDefaults()
	errs := make([]error, 0, len(fileErrs)+2)
	for _, e := range fileErrs {
		errs = append(errs, e)
	}
	for _, e := range []error{envErr, c.Validate()} {
		errs = append(errs, withoutDropped(e, fileErrs)...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &c, nil
}

// withoutDropped is the errors joined in err, less those about a value the file check already
// refused (that value was dropped, so validation saw the default and would blame it wrongly).
func withoutDropped(err error, dropped []fileError) []error {
	if err == nil {
		return nil
	}
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	var out []error
next:
	for _, e := range list {
		msg := e.Error()
		for _, d := range dropped {
			for _, sep := range []string{":", ".", "["} {
				if strings.HasPrefix(msg, "config: "+d.path+sep) {
					continue next
				}
			}
		}
		out = append(out, e)
	}
	return out
}

func (c *Config) applyDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.Policy.Mode == "" {
		c.Policy.Mode = ModeEnforce
	}
	if c.Policy.OverflowStatus == 0 {
		c.Policy.OverflowStatus = 413
	}
	if c.Tokenizer.RemoteImages == "" {
		c.Tokenizer.RemoteImages = RemoteImagesRefuse
	}
	if c.Policy.CountDrift.Threshold == 0 {
		c.Policy.CountDrift.Threshold = 3 // a single drift may be an engine's glitch; three are a pattern
	}
	if c.Policy.CountDrift.Window == 0 {
		c.Policy.CountDrift.Window = 10 * time.Minute
	}
	if c.Tokenizer.Library == "" {
		c.Tokenizer.Library = LibraryKvgate // the fastest exact counter (issue 33)
	}
	if c.Tokenizer.Encoding == "" {
		c.Tokenizer.Encoding = "cl100k_base"
	}
	if c.Tokenizer.SafetyRatio == 0 {
		c.Tokenizer.SafetyRatio = 1.3
	}
	if c.Tokenizer.SafetyRatioMax == 0 {
		c.Tokenizer.SafetyRatioMax = 2.0
	}
	if c.Tokenizer.ExactConcurrency == 0 {
		c.Tokenizer.ExactConcurrency = 4
	}
	if c.Tokenizer.ExactTimeout == 0 {
		c.Tokenizer.ExactTimeout = 2 * time.Second
	}
	if c.Tokenizer.CalibrationRetryMax == 0 {
		c.Tokenizer.CalibrationRetryMax = 30 * time.Second
	}
	if c.State.RedisMode == "" {
		c.State.RedisMode = RedisStandalone
	}
	if c.State.KeyPrefix == "" {
		c.State.KeyPrefix = "kvgate:"
	}
	if c.Canary.Epoch == 0 {
		c.Canary.Epoch = time.Hour
	}
	if c.Canary.DetectWindow == 0 {
		c.Canary.DetectWindow = 24 * time.Hour
	}
	if c.Canary.Placement == "" {
		c.Canary.Placement = PlacementSystemEnd
	}
	if c.Canary.QuarantineTTL == 0 {
		c.Canary.QuarantineTTL = 15 * time.Minute
	}
	if c.Canary.IncidentTTL == 0 {
		c.Canary.IncidentTTL = 168 * time.Hour
	}
	if c.Canary.Fingerprints.MaxBytes == 0 {
		c.Canary.Fingerprints.MaxBytes = 64 << 20
	}
	if c.Canary.Fingerprints.CutMatches == 0 {
		c.Canary.Fingerprints.CutMatches = 3
	}
	if c.Canary.Fingerprints.CommonTenants == 0 {
		c.Canary.Fingerprints.CommonTenants = 3
	}
	if c.Canary.Fingerprints.Mode == "" {
		c.Canary.Fingerprints.Mode = ModeEnforce
	}
	if c.Canary.Fingerprints.CorroborationWindow == 0 {
		c.Canary.Fingerprints.CorroborationWindow = time.Hour
	}
	if c.Canary.Fingerprints.CorroborationTenants == 0 {
		c.Canary.Fingerprints.CorroborationTenants = 2
	}
	if c.Canary.Fingerprints.QuarantinesPerRequester == 0 {
		c.Canary.Fingerprints.QuarantinesPerRequester = 1
	}
	if c.Capacity.PollInterval == 0 {
		c.Capacity.PollInterval = 2 * time.Second
	}
	if c.Capacity.MaxAge == 0 {
		// Three missed polls in a row: long enough to ride out one slow reply, short enough
		// that a restarted engine's new pool is not trusted stale for long.
		c.Capacity.MaxAge = 3 * c.Capacity.PollInterval
	}
	if c.Capacity.Timeout == 0 {
		c.Capacity.Timeout = 2 * time.Second
	}
	if c.Upstream.ResponseHeaderTimeout == 0 {
		c.Upstream.ResponseHeaderTimeout = 300 * time.Second
	}
	if c.Upstream.IdleTimeout == 0 {
		c.Upstream.IdleTimeout = 60 * time.Second
	}
	if c.Upstream.MaxConns == 0 {
		c.Upstream.MaxConns = 4096
	}
	if c.Upstream.MaxEventBytes == 0 {
		c.Upstream.MaxEventBytes = 4 << 20
	}
	if c.Upstream.MaxReplyBytes == 0 {
		c.Upstream.MaxReplyBytes = 64 << 20
	}
	if c.Upstream.MaxBufferedBytes == 0 {
		c.Upstream.MaxBufferedBytes = 256 << 20
	}
	if c.Limits.Replicas == 0 {
		c.Limits.Replicas = 1
	}
	if c.Server.HeaderTimeout == 0 {
		c.Server.HeaderTimeout = 10 * time.Second
	}
	if c.Server.ReadTimeout == 0 {
		c.Server.ReadTimeout = 30 * time.Second
	}
	if c.Server.IdleTimeout == 0 {
		c.Server.IdleTimeout = 120 * time.Second
	}
	if c.Server.MaxHeaderBytes == 0 {
		c.Server.MaxHeaderBytes = 8 << 10
	}
	if c.Server.MetricsAuth == "" {
		c.Server.MetricsAuth = MetricsAuthKey
	}
	throttle := &c.Server.AuthThrottle
	if throttle.FreeFailures == 0 {
		throttle.FreeFailures = 5
	}
	if throttle.Backoff == 0 {
		throttle.Backoff = time.Second
	}
	if throttle.LockoutAfter == 0 {
		throttle.LockoutAfter = 10
	}
	if throttle.Lockout == 0 {
		throttle.Lockout = 15 * time.Minute
	}
	if throttle.MaxAddresses == 0 {
		throttle.MaxAddresses = 10000
	}
	if c.Server.MaxConns == 0 {
		c.Server.MaxConns = 65536
	}
	if c.Limits.RedisTimeout == 0 {
		c.Limits.RedisTimeout = 100 * time.Millisecond
	}
	if c.Queue.Policy == "" {
		c.Queue.Policy = QueueFair
	}
	if c.Queue.Timeout == 0 {
		c.Queue.Timeout = 30 * time.Second
	}
	if c.Queue.MaxQueued == 0 {
		c.Queue.MaxQueued = 1024
	}
	for i := range c.Tenants {
		c.Tenants[i].SetDefaults()
	}
	if c.Discovery.Interval == 0 {
		c.Discovery.Interval = 10 * time.Second
	}
	for i := range c.Models {
		if t := c.Models[i].Tokenizer; t != nil {
			// A model that names its own library or encoding does not inherit the top-level
			// hf_dir (which would override them: it is another model's tokenizer).
			ownEstimator := t.HFDir == "" && (t.Library != "" || t.Encoding != "")
			fillZero(reflect.ValueOf(t).Elem(), reflect.ValueOf(&c.Tokenizer).Elem())
			if ownEstimator {
				t.HFDir = ""
			}
		}
	}
}

// Warnings are what a valid configuration does that its operator may not expect, naming the
// field: kvgate check prints them and kvgate serve logs them at start.
func (c *Config) Warnings() []string {
	var out []string
	if c.Server.MetricsAuth == MetricsAuthKey && c.Server.MetricsKeySHA256 == "" && c.AdminKeySHA256 == "" {
		out = append(out, "server.metrics_auth: key (the default) with neither server.metrics_key_sha256 nor admin_key_sha256: "+
			"/metrics answers 401 to every scraper. Set server.metrics_key_sha256 to the SHA-256 of a scrape key, "+
			"or server.metrics_auth: none to publish tenant and backend names to whoever reaches the listener.")
	}
	return out
}

// Validate refuses a configuration that cannot work, naming the field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	// oneOf refuses a value outside allowed, listing them.
	oneOf := func(field, got string, allowed ...string) bool {
		for _, a := range allowed {
			if got == a {
				return true
			}
		}
		bad(field, "must be %s or %s, got %q", strings.Join(allowed[:len(allowed)-1], ", "), allowed[len(allowed)-1], got)
		return false
	}
	if c.MaxBodyBytes < 0 {
		bad("max_body_bytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	if c.AdminKeySHA256 != "" && !isSHA256Hex(c.AdminKeySHA256) {
		bad("admin_key_sha256", "must be 64 hex characters (sha256 of the admin key)")
	}
	if len(c.Backends) == 0 {
		bad("backends", "at least one backend is required")
	}
	names := map[string]bool{}
	roles := map[Role]int{}
	for i, b := range c.Backends {
		f := fmt.Sprintf("backends[%d]", i)
		if b.Name == "" {
			bad(f+".name", "required")
		} else if names[b.Name] {
			bad(f+".name", "duplicate name %q", b.Name)
		} else if strings.ContainsAny(b.Name, "/ ") {
			bad(f+".name", "%q must not contain '/' or spaces (it appears in admin URLs)", b.Name)
		}
		names[b.Name] = true
		if scheme, _, err := b.Address(); err != nil {
			bad(f+".url", "%v", err)
		} else if scheme == "http" && !b.TLS.IsZero() {
			bad(f+".tls", "only for https:// URLs (%q is plaintext; kvgate never falls back to it from TLS, nor upgrades it)", b.URL)
		} else if scheme == "https" {
			if _, err := b.TLS.ClientConfig(); err != nil {
				bad(f+".tls", "%v", err)
			}
		}
		if b.Discover != "" && b.Discover != "dns" {
			bad(f+".discover", "must be dns or empty, got %q", b.Discover)
		}
		if oneOf(f+".role", string(b.Role), string(RoleUnified), string(RolePrefill), string(RoleDecode)) {
			roles[b.Role]++
		}
	}
	if (roles[RolePrefill] > 0) != (roles[RoleDecode] > 0) {
		bad("backends", "prefill and decode backends come in pairs: have %d prefill and %d decode", roles[RolePrefill], roles[RoleDecode])
	}
	c.validateModels(bad)
	tenantNames := map[string]bool{}
	keys := map[string]bool{}
	for i, t := range c.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			bad(f+".name", "required")
		} else if tenantNames[t.Name] {
			bad(f+".name", "duplicate name %q", t.Name)
		}
		tenantNames[t.Name] = true
		if isSHA256Hex(t.KeySHA256) && keys[strings.ToLower(t.KeySHA256)] {
			bad(f+".key_sha256", "the same key is configured for two tenants")
		}
		keys[strings.ToLower(t.KeySHA256)] = true
		t.Check(func(field, format string, args ...any) { bad(f+"."+field, format, args...) })
	}
	oneOf("queue.policy", string(c.Queue.Policy), string(QueueFair), string(QueueRoundRobin))
	if c.Queue.Timeout < 0 || c.Queue.Timeout > 10*time.Minute {
		bad("queue.timeout", "must be between 0 and 10m, got %s", c.Queue.Timeout)
	}
	if c.Queue.MaxQueued < 1 || c.Queue.MaxQueued > 1_000_000 {
		bad("queue.max_queued", "must be between 1 and 1000000, got %d", c.Queue.MaxQueued)
	}
	oneOf("policy.mode", string(c.Policy.Mode), string(ModeEnforce), string(ModeMonitor))
	if c.Policy.Isolation.RefuseShared && c.Policy.SharePrefixCache {
		// Salts are what the verdict is about; without them every backend shares by design.
		bad("policy.isolation.refuse_shared", "means nothing with policy.share_prefix_cache: true (no salts are set)")
	}
	if c.Policy.OverflowStatus != 413 && c.Policy.OverflowStatus != 400 {
		bad("policy.overflow_status", "must be 413 or 400, got %d", c.Policy.OverflowStatus)
	}
	if c.Policy.CountDrift.Threshold < 1 {
		bad("policy.count_drift.threshold", "must be ≥ 1, got %d", c.Policy.CountDrift.Threshold)
	}
	if w := c.Policy.CountDrift.Window; w < time.Second || w > 24*time.Hour {
		bad("policy.count_drift.window", "must be from 1s to 24h, got %s", w)
	}
	if c.Policy.DefaultMaxTokens < 0 {
		bad("policy.default_max_tokens", "must be ≥ 0, got %d", c.Policy.DefaultMaxTokens)
	}
	checkLibrary(bad, "tokenizer.library", c.Tokenizer.Library)
	if err := CheckHFDir(c.Tokenizer.HFDir); err != nil {
		bad("tokenizer.hf_dir", "%v", err)
	}
	oneOf("tokenizer.remote_images", string(c.Tokenizer.RemoteImages), string(RemoteImagesRefuse), string(RemoteImagesCountMax))
	oneOf("tokenizer.encoding", c.Tokenizer.Encoding, "cl100k_base", "o200k_base")
	if c.Tokenizer.SafetyRatio < 1 {
		bad("tokenizer.safety_ratio", "must be ≥ 1, got %v", c.Tokenizer.SafetyRatio)
	}
	if c.Tokenizer.SafetyRatioMax < c.Tokenizer.SafetyRatio {
		bad("tokenizer.safety_ratio_max", "must be ≥ safety_ratio (%v), got %v", c.Tokenizer.SafetyRatio, c.Tokenizer.SafetyRatioMax)
	}
	if c.Tokenizer.ExactConcurrency < 0 {
		bad("tokenizer.exact_concurrency", "must be ≥ 0, got %d", c.Tokenizer.ExactConcurrency)
	}
	oneOf("state.redis_mode", string(c.State.RedisMode), string(RedisStandalone), string(RedisSentinel), string(RedisCluster))
	if strings.ContainsAny(c.State.KeyPrefix, "{}") {
		// Every key's hash tag is the first {…} (state.Keys): a brace in the prefix would become
		// the tag and put every tenant's limit cells on one Cluster slot.
		bad("state.key_prefix", "must not contain '{' or '}' (kvgate adds the Redis Cluster hash tags itself), got %q", c.State.KeyPrefix)
	}
	if c.Canary.Enabled && c.Canary.Secret == "" {
		bad("canary.secret", "required when canary.enabled is true (or set KVGATE_CANARY_SECRET or KVGATE_CANARY_SECRET_FILE)")
	} else if c.Canary.Secret != "" && len(c.Canary.Secret) < MinCanarySecretBytes {
		// Checked even while canaries are off: turning them on later must not need a new secret.
		bad("canary.secret", "must be at least %d bytes, got %d", MinCanarySecretBytes, len(c.Canary.Secret))
	}
	if c.State.RedisURL != "" {
		if err := CheckRedisURL(c.State.RedisURL, c.State.RedisMode); err != nil {
			bad("state.redis_url", "%v", err)
		}
	}
	if c.Canary.EveryBytes < 0 {
		bad("canary.every_bytes", "must be ≥ 0 (0 = once), got %d", c.Canary.EveryBytes)
	}
	oneOf("canary.placement", string(c.Canary.Placement), string(PlacementSystemEnd), string(PlacementPrefix))
	if f := c.Canary.Fingerprints; f.MaxBytes < 1<<20 {
		bad("canary.fingerprints.max_bytes", "must be at least 1048576 (1 MiB), got %d", f.MaxBytes)
	}
	if f := c.Canary.Fingerprints; f.CutMatches < 1 || f.CutMatches > 1000 {
		bad("canary.fingerprints.cut_matches", "must be 1 to 1000, got %d", f.CutMatches)
	}
	oneOf("canary.fingerprints.mode", string(c.Canary.Fingerprints.Mode), string(ModeEnforce), string(ModeMonitor))
	if f := c.Canary.Fingerprints; f.CorroborationTenants < 2 || f.CorroborationTenants > 1000 {
		bad("canary.fingerprints.corroboration_tenants", "must be 2 to 1000 (one requester or one victim is no corroboration), got %d", f.CorroborationTenants)
	}
	if f := c.Canary.Fingerprints; f.QuarantinesPerRequester < 1 || f.QuarantinesPerRequester > 1000 {
		bad("canary.fingerprints.quarantines_per_requester", "must be 1 to 1000, got %d", f.QuarantinesPerRequester)
	}
	if f := c.Canary.Fingerprints; f.CommonTenants < 2 || f.CommonTenants > 1000 {
		bad("canary.fingerprints.common_tenants", "must be 2 to 1000 (text that many tenants sent is boilerplate), got %d", f.CommonTenants)
	}
	if c.Canary.DetectWindow < c.Canary.Epoch {
		bad("canary.detect_window", "must be ≥ canary.epoch (%s), got %s", c.Canary.Epoch, c.Canary.DetectWindow)
	}
	if c.Capacity.MaxAge < c.Capacity.PollInterval {
		bad("capacity.max_age", "must be ≥ capacity.poll_interval (%s), got %s", c.Capacity.PollInterval, c.Capacity.MaxAge)
	}
	if c.Upstream.MaxEventBytes < 1024 {
		bad("upstream.max_event_bytes", "must be at least 1024, got %d", c.Upstream.MaxEventBytes)
	}
	if c.Upstream.MaxReplyBytes < 1024 {
		bad("upstream.max_reply_bytes", "must be at least 1024, got %d", c.Upstream.MaxReplyBytes)
	}
	if min := int64(ReplyCostFactor) * int64(c.Upstream.MaxReplyBytes); c.Upstream.MaxBufferedBytes < min {
		bad("upstream.max_buffered_bytes", "must be ≥ %d × upstream.max_reply_bytes (%d), got %d",
			ReplyCostFactor, min, c.Upstream.MaxBufferedBytes)
	}
	if c.Upstream.Retries < 0 {
		bad("upstream.retries", "must be ≥ 0, got %d", c.Upstream.Retries)
	}
	if c.Limits.Replicas < 1 {
		bad("limits.replicas", "must be ≥ 1, got %d", c.Limits.Replicas)
	}
	if c.Limits.RedisTimeout < 0 || c.Limits.RedisTimeout > 5*time.Second {
		// A long bound would let a sick Redis hold every request; a short one only falls back.
		bad("limits.redis_timeout", "must be between 0 and 5s, got %s", c.Limits.RedisTimeout)
	}
	// Zero took the default above; a negative duration would panic a ticker (poll_interval) or
	// fail every call at once.
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"capacity.poll_interval", c.Capacity.PollInterval}, {"capacity.max_age", c.Capacity.MaxAge},
		{"capacity.timeout", c.Capacity.Timeout}, {"upstream.response_header_timeout", c.Upstream.ResponseHeaderTimeout},
		{"upstream.idle_timeout", c.Upstream.IdleTimeout}, {"tokenizer.exact_timeout", c.Tokenizer.ExactTimeout},
		{"tokenizer.calibration_retry_max", c.Tokenizer.CalibrationRetryMax},
		{"canary.epoch", c.Canary.Epoch}, {"canary.detect_window", c.Canary.DetectWindow},
		{"canary.quarantine_ttl", c.Canary.QuarantineTTL}, {"canary.incident_ttl", c.Canary.IncidentTTL},
		{"canary.fingerprints.corroboration_window", c.Canary.Fingerprints.CorroborationWindow},
		{"server.header_timeout", c.Server.HeaderTimeout}, {"server.read_timeout", c.Server.ReadTimeout},
		{"server.idle_timeout", c.Server.IdleTimeout},
	} {
		if d.v <= 0 {
			bad(d.name, "must be positive, got %s", d.v)
		}
	}
	if c.Upstream.MaxConns < 1 {
		bad("upstream.max_conns", "must be ≥ 1, got %d", c.Upstream.MaxConns)
	}
	if c.Server.MaxHeaderBytes < 1024 {
		bad("server.max_header_bytes", "must be at least 1024, got %d", c.Server.MaxHeaderBytes)
	}
	if c.Server.MaxConns < 1 {
		bad("server.max_conns", "must be ≥ 1, got %d", c.Server.MaxConns)
	}
	oneOf("server.metrics_auth", string(c.Server.MetricsAuth), string(MetricsAuthKey), string(MetricsAuthAdmin), string(MetricsAuthNone))
	if c.Server.MetricsAuth == MetricsAuthAdmin && c.AdminKeySHA256 == "" {
		bad("server.metrics_auth", "admin needs admin_key_sha256 (without it /metrics could never be read)")
	}
	if c.Server.MetricsKeySHA256 != "" && !isSHA256Hex(c.Server.MetricsKeySHA256) {
		bad("server.metrics_key_sha256", "must be 64 hex characters (sha256 of the scrape key)")
	}
	if t := c.Server.AuthThrottle; t.FreeFailures < 0 || t.LockoutAfter <= t.FreeFailures || t.Backoff < 0 || t.Lockout < 0 || t.MaxAddresses < 0 {
		bad("server.auth_throttle", "needs 0 < free_failures < lockout_after and a positive backoff, lockout and max_addresses, got %+v", t)
	}
	if c.Server.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.Server.MetricsListen); err != nil {
			bad("server.metrics_listen", "must be host:port, got %q", c.Server.MetricsListen)
		} else if c.Server.MetricsListen == c.Listen {
			bad("server.metrics_listen", "must differ from listen (%s)", c.Listen)
		}
	}
	if c.Discovery.Interval < 100*time.Millisecond {
		bad("discovery.interval", "must be at least 100ms, got %s", c.Discovery.Interval)
	}
	if c.Discovery.Resolver != "" {
		if _, _, err := net.SplitHostPort(c.Discovery.Resolver); err != nil {
			bad("discovery.resolver", "must be host:port (a DNS server), got %q", c.Discovery.Resolver)
		}
	}
	if c.Server.DrainDelay < 0 {
		bad("server.drain_delay", "must be ≥ 0 (0 = no delay), got %s", c.Server.DrainDelay)
	}
	if c.Server.DrainTimeout < 0 {
		bad("server.drain_timeout", "must be ≥ 0 (0 = cut streams at once), got %s", c.Server.DrainTimeout)
	}
	if c.Server.MaxConnsPerIP < 0 {
		bad("server.max_conns_per_ip", "must be ≥ 0 (0 = no limit), got %d", c.Server.MaxConnsPerIP)
	}
	return errors.Join(errs...)
}

// validateModels: once any model is named, every backend names one; names and aliases are
// unique ids; every prefill has a decode of its model (and group), and the other way round.
// checkLibrary refuses a tokenizer library kvgate does not build in.
func checkLibrary(bad func(field, format string, args ...any), field string, got Library) {
	switch got {
	case LibraryKvgate, LibraryTiktokenGo:
	case "pkoukk": // a second tiktoken library in the binary, removed in issue 33
		bad(field, "%q is no longer built in: use %s (the default: the same counts, faster) or %s", got, LibraryKvgate, LibraryTiktokenGo)
	default:
		bad(field, "must be %s or %s, got %q", LibraryKvgate, LibraryTiktokenGo, got)
	}
}

func (c *Config) validateModels(bad func(field, format string, args ...any)) {
	if !c.MultiModel() {
		return
	}
	ids := map[string]string{} // id → where it was defined
	claim := func(id, field string) {
		if id == "" {
			bad(field, "required")
		} else if prev, dup := ids[id]; dup {
			bad(field, "%q is already %s", id, prev)
		} else if strings.ContainsAny(id, " \t\n") {
			bad(field, "%q must not contain spaces", id)
		} else {
			ids[id] = field
		}
	}
	for i, m := range c.Models {
		f := fmt.Sprintf("models[%d]", i)
		claim(m.Name, f+".name")
		for j, a := range m.Aliases {
			claim(a, fmt.Sprintf("%s.aliases[%d]", f, j))
		}
		if t := m.Tokenizer; t != nil {
			checkLibrary(bad, f+".tokenizer.library", t.Library)
			if err := CheckHFDir(t.HFDir); err != nil {
				bad(f+".tokenizer.hf_dir", "%v", err)
			}
			if t.RemoteImages != RemoteImagesRefuse && t.RemoteImages != RemoteImagesCountMax {
				bad(f+".tokenizer.remote_images", "must be %s or %s, got %q", RemoteImagesRefuse, RemoteImagesCountMax, t.RemoteImages)
			}
			if t.Encoding != "cl100k_base" && t.Encoding != "o200k_base" {
				bad(f+".tokenizer.encoding", "must be cl100k_base or o200k_base, got %q", t.Encoding)
			}
			if t.SafetyRatio < 1 || t.SafetyRatioMax < t.SafetyRatio {
				bad(f+".tokenizer.safety_ratio", "must be ≥ 1 and ≤ safety_ratio_max, got %v and %v", t.SafetyRatio, t.SafetyRatioMax)
			}
		}
	}
	type pdKey struct{ model, group string }
	halves := map[pdKey][2]int{}
	for i, b := range c.Backends {
		f := fmt.Sprintf("backends[%d].model", i)
		if b.Model == "" {
			bad(f, "required once any backend or models[] names a model (requests are routed by model)")
			continue
		}
		if len(c.Models) > 0 {
			if where, ok := ids[b.Model]; !ok || !strings.HasSuffix(where, ".name") {
				bad(f, "%q is not a models[].name", b.Model)
			}
		}
		k, h := pdKey{b.Model, b.Group}, halves[pdKey{b.Model, b.Group}]
		switch b.Role {
		case RolePrefill:
			h[0]++
		case RoleDecode:
			h[1]++
		}
		halves[k] = h
	}
	for k, h := range halves {
		if (h[0] > 0) != (h[1] > 0) {
			bad("backends", "model %q group %q: prefill and decode backends come in pairs: have %d prefill and %d decode", k.model, k.group, h[0], h[1])
		}
	}
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// ApplyEnv applies KVGATE_* variables over the file:
//   - every scalar setting: KVGATE_ followed by the field's YAML path in upper case joined by "_"
//     (KVGATE_LISTEN, KVGATE_POLICY_MODE, KVGATE_CANARY_SECRET, KVGATE_STATE_REDIS_URL);
//   - every list (KVGATE_BACKENDS, KVGATE_TENANTS): a YAML (or JSON) list that replaces the
//     file's, its entries checked like the file's;
//   - one backend's key: KVGATE_BACKENDS_<NAME>_API_KEY, NAME being the backend's name in upper
//     case with every other character than A-Z and 0-9 as "_" (backend "gpu-a" is
//     KVGATE_BACKENDS_GPU_A_API_KEY), so a key need not sit in the file;
//   - any of these with _FILE appended reads the value from that file instead (one trailing
//     newline dropped): how secrets mounted as files (Kubernetes, Docker) are passed.
//
// Any other KVGATE_* variable is an error naming it (a misspelt override must not be silently
// ignored), except those of NonConfigEnv. Values never appear in errors.
func ApplyEnv(c *Config, environ []string) error {
	scalars, lists := map[string]reflect.Value{}, map[string]reflect.Value{}
	collectEnvFields(reflect.ValueOf(c).Elem(), "KVGATE", scalars, lists)
	var errs []error
	// Resolve _FILE first, so that every later step sees one value per setting.
	type setting struct{ value, from string } // from: the variable that gave it (for errors)
	env := map[string]setting{}
	var names []string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "KVGATE_") || NonConfigEnv[name] {
			continue
		}
		base := name
		if b, isFile := strings.CutSuffix(name, "_FILE"); isFile {
			raw, err := os.ReadFile(value)
			if err != nil {
				errs = append(errs, fmt.Errorf("config: environment %s: %w", name, err))
				continue
			}
			base, value = b, strings.TrimSuffix(strings.TrimSuffix(string(raw), "\n"), "\r")
		}
		if prev, dup := env[base]; dup {
			errs = append(errs, fmt.Errorf("config: environment %s and %s both set %s: keep one", prev.from, name, base))
			continue
		}
		env[base] = setting{value, name}
		names = append(names, base)
	}
	sort.Strings(names)
	// Lists before the backend keys, which name backends of the final list.
	for _, name := range names {
		if f, ok := lists[name]; ok {
			if err := setList(f, env[name].value); err != nil {
				errs = append(errs, fmt.Errorf("config: environment %s: %w", env[name].from, err))
			}
		}
	}
	backendKeys := map[string][]int{}
	for i, b := range c.Backends {
		n := "KVGATE_BACKENDS_" + envName(b.Name) + "_API_KEY"
		backendKeys[n] = append(backendKeys[n], i)
	}
	for _, name := range names {
		s := env[name]
		if _, ok := lists[name]; ok {
			continue
		}
		if f, ok := scalars[name]; ok {
			if err := setScalar(f, s.value); err != nil {
				errs = append(errs, fmt.Errorf("config: environment %s: %w", s.from, err))
			}
			continue
		}
		if idx, ok := backendKeys[name]; ok {
			if len(idx) > 1 {
				errs = append(errs, fmt.Errorf("config: environment %s: backends[%d] and backends[%d] both map to this name; rename one", s.from, idx[0], idx[1]))
				continue
			}
			c.Backends[idx[0]].APIKey = s.value
			continue
		}
		errs = append(errs, fmt.Errorf("config: environment %s: no such setting (names are KVGATE_ and the YAML path, like KVGATE_STATE_REDIS_URL; KVGATE_BACKENDS_<NAME>_API_KEY for a configured backend's key; _FILE appended reads the value from a file)", s.from))
	}
	return errors.Join(errs...)
}

// envName is a backend name as it appears in a variable's name: upper case, every character
// other than A-Z and 0-9 replaced by "_".
func envName(name string) string {
	b := []byte(strings.ToUpper(name))
	for i, ch := range b {
		if (ch < 'A' || ch > 'Z') && (ch < '0' || ch > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// setList decodes value (YAML or JSON) as the whole list f, unknown keys refused as in the file.
func setList(f reflect.Value, value string) error {
	v := reflect.New(f.Type())
	dec := yaml.NewDecoder(strings.NewReader(value))
	dec.KnownFields(true)
	if err := dec.Decode(v.Interface()); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("not a YAML list of %s entries: %w", f.Type().Elem().Name(), err)
	}
	f.Set(v.Elem())
	return nil
}

// NonConfigEnv are KVGATE_* variables that are not settings: those of kvgate's own tests, lab
// and benchmarks, which a test run hands down to the processes it starts.
var NonConfigEnv = map[string]bool{
	"KVGATE_BIN": true, "KVGATE_LAB_BIN": true, "KVGATE_TEST_REDIS": true, "KVGATE_PROPERTY_SEED": true,
	"KVGATE_TEST_HOUR": true, "KVGATE_PROPERTY_HOUR": true,
	"KVGATE_TOKENIZE_OFFLINE_CHILD": true, "KVGATE_DEMO_DEBUG": true,
	"KVGATE_BENCH_ROLE": true, "KVGATE_BENCH_LISTEN": true, "KVGATE_BENCH_UPSTREAM": true,
}

// CheckRedisURL parses url as state.NewClient will for mode (go-redis's own parsers), without
// connecting, so a bad URL is refused with the configuration rather than at start.
func CheckRedisURL(url string, mode RedisMode) error {
	var err error
	switch mode {
	case RedisStandalone, "":
		_, err = redis.ParseURL(url)
	case RedisSentinel:
		var opt *redis.FailoverOptions
		if opt, err = redis.ParseFailoverURL(url); err == nil && opt.MasterName == "" {
			err = errors.New("missing ?master_name=<name> (a sentinel client cannot find its master without it)")
		}
	case RedisCluster:
		_, err = redis.ParseClusterURL(url)
	default:
		return nil // state.redis_mode names its own error
	}
	if err != nil {
		// url.Parse's error quotes the whole URL, password included: keep only its reason.
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("does not parse for redis_mode %s: %w", mode, err)
	}
	return nil
}

// Redacted is a copy of c safe to print: the canary secret, backend api_keys and any password in
// the Redis URL are replaced by "REDACTED" (empty ones stay empty, so their absence shows).
func (c *Config) Redacted() *Config {
	r := *c
	const mask = "REDACTED"
	if r.Canary.Secret != "" {
		r.Canary.Secret = mask
	}
	r.Backends = append([]Backend(nil), c.Backends...)
	for i := range r.Backends {
		if r.Backends[i].APIKey != "" {
			r.Backends[i].APIKey = mask
		}
	}
	r.Tenants = append([]Tenant(nil), c.Tenants...)
	if u, err := neturl.Parse(r.State.RedisURL); err == nil && r.State.RedisURL != "" {
		if u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = neturl.UserPassword(u.User.Username(), mask)
			} else {
				u.User = neturl.User(mask) // a lone user part may be how the password was given
			}
		}
		// Sentinel URLs carry passwords as query parameters (password, sentinel_password).
		if q := u.Query(); len(q) > 0 {
			for k := range q {
				if strings.Contains(strings.ToLower(k), "password") {
					q.Set(k, mask)
				}
			}
			u.RawQuery = q.Encode()
		}
		r.State.RedisURL = u.String()
	}
	return &r
}

// EnvNames lists every setting variable ApplyEnv understands, scalars and lists (for docs and
// tests; the per-backend keys and the _FILE forms come on top).
func EnvNames() []string {
	scalars, lists := map[string]reflect.Value{}, map[string]reflect.Value{}
	var c Config
	collectEnvFields(reflect.ValueOf(&c).Elem(), "KVGATE", scalars, lists)
	out := make([]string, 0, len(scalars)+len(lists))
	for k := range scalars {
		out = append(out, k)
	}
	for k := range lists {
		out = append(out, k)
	}
	return out
}

func collectEnvFields(v reflect.Value, prefix string, out, lists map[string]reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + "_" + strings.ToUpper(tag)
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Struct:
			collectEnvFields(f, name, out, lists)
		case reflect.Slice:
			lists[name] = f
		case reflect.Map:
			// no map settings
		default:
			out[name] = f
		}
	}
}

var durationType = reflect.TypeOf(time.Duration(0))

func setScalar(f reflect.Value, s string) error {
	if f.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("not a duration (like 2s, 1h): %q", s)
		}
		f.SetInt(int64(d))
		return nil
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("not a boolean: %q", s)
		}
		f.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer: %q", s)
		}
		f.SetInt(n)
	case reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("not a number: %q", s)
		}
		f.SetFloat(x)
	default:
		return fmt.Errorf("unsupported field kind %s", f.Kind())
	}
	return nil
}

// SHA256Hex is how keys are stored in the config: the hex SHA-256 of the key.
func SHA256Hex(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}
