package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const key = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"

const minimal = `
backends:
  - {name: sim, url: "http://127.0.0.1:30000", role: unified}
tenants:
  - {name: alice, key_sha256: "` + key + `"}
`

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" || c.MaxBodyBytes != 32<<20 || c.Policy.Mode != "enforce" ||
		c.Policy.OverflowStatus != 413 || c.Policy.CountDrift.Threshold != 3 || c.Policy.CountDrift.Window != 10*time.Minute ||
		c.Tokenizer.Library != "kvgate" || c.Tokenizer.SafetyRatio != 1.3 ||
		c.State.RedisMode != "standalone" || c.Canary.Epoch != time.Hour || c.Capacity.MaxAge != 6*time.Second ||
		c.Upstream.MaxReplyBytes != 64<<20 || c.Upstream.MaxBufferedBytes != 256<<20 ||
		c.Server.MetricsAuth != MetricsAuthKey || c.Server.MetricsListen != "" {
		t.Fatalf("defaults not applied: %+v", c)
	}
	// Issue 31: wrong admin or metrics keys back off after 5 per address, lock out at 10.
	if a := c.Server.AuthThrottle; a != (AuthThrottle{FreeFailures: 5, Backoff: time.Second, LockoutAfter: 10, Lockout: 15 * time.Minute, MaxAddresses: 10000}) {
		t.Fatalf("auth throttle defaults: %+v", a)
	}
	// Prompt fingerprints are on with canaries, incidents hold no text and expire.
	if f := c.Canary.Fingerprints; f.Off || f.MaxBytes != 64<<20 || f.CutMatches != 3 || f.CommonTenants != 3 ||
		c.Canary.IncidentContext || c.Canary.IncidentTTL != 168*time.Hour {
		t.Fatalf("canary defaults not applied: %+v", c.Canary)
	}
}

func TestEnvOverrides(t *testing.T) {
	env := []string{
		"KVGATE_LISTEN=127.0.0.1:9999",
		"KVGATE_POLICY_MODE=monitor",
		"KVGATE_TOKENIZER_SAFETY_RATIO=1.5",
		"KVGATE_CANARY_ENABLED=true",
		"KVGATE_CANARY_SECRET=s3cret-of-at-least-32-bytes-long!",
		"KVGATE_CAPACITY_POLL_INTERVAL=500ms",
		"KVGATE_TEST_REDIS=redis://127.0.0.1:6379/15", // a test tool's variable, not a setting
		"PATH=/bin",
	}
	c, err := Parse([]byte(minimal), env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9999" || c.Policy.Mode != "monitor" || c.Tokenizer.SafetyRatio != 1.5 ||
		!c.Canary.Enabled || c.Canary.Secret != "s3cret-of-at-least-32-bytes-long!" || c.Capacity.PollInterval != 500*time.Millisecond {
		t.Fatalf("overrides not applied: %+v", c)
	}
	if c.Capacity.MaxAge != 1500*time.Millisecond {
		t.Fatalf("max_age default must follow the overridden poll interval, got %s", c.Capacity.MaxAge)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct{ name, yaml, env, want string }{
		{"unknown key", minimal + "lsiten: x\n", "", "lsiten"},
		{"unknown nested key", minimal + "policy: {mdoe: x}\n", "", "mdoe"},
		{"no backends", "tenants: []\n", "", "backends: at least one"},
		{"bad role", `backends: [{name: a, url: "http://127.0.0.1:1", role: mixed}]`, "", "backends[0].role"},
		{"bad url", `backends: [{name: a, url: "127.0.0.1:1", role: unified}]`, "", "backends[0].url"},
		{"url with a base path", `backends: [{name: a, url: "http://127.0.0.1:1/v1", role: unified}]`, "", `backends[0].url: must not have a path`},
		{"url with a query", `backends: [{name: a, url: "http://127.0.0.1:1?x=1", role: unified}]`, "", `backends[0].url`},
		{"url port out of range", `backends: [{name: a, url: "http://127.0.0.1:70000", role: unified}]`, "", `backends[0].url`},
		{"model on one backend only", "backends: [{name: a, url: \"http://h:1\", role: unified, model: m}, {name: b, url: \"http://h:2\", role: unified}]\n", "", "backends[1].model: required"},
		{"model not listed", "backends: [{name: a, url: \"http://h:1\", role: unified, model: m}]\nmodels: [{name: x}]\n", "", `backends[0].model: "m" is not a models[].name`},
		{"alias taken", "backends: [{name: a, url: \"http://h:1\", role: unified, model: m}]\nmodels: [{name: m}, {name: n, aliases: [m]}]\n", "", "models[1].aliases[0]"},
		{"model tokenizer", "backends: [{name: a, url: \"http://h:1\", role: unified, model: m}]\nmodels: [{name: m, tokenizer: {encoding: p50k}}]\n", "", "models[0].tokenizer.encoding"},
		{"pd pair across models", "backends: [{name: a, url: \"http://h:1\", role: prefill, model: m}, {name: b, url: \"http://h:2\", role: decode, model: n}]\n", "", `model "m" group "": prefill and decode`},
		{"tls on plaintext", `backends: [{name: a, url: "http://127.0.0.1:1", role: unified, tls: {server_name: x}}]`, "", "backends[0].tls: only for https://"},
		{"tls ca file missing", `backends: [{name: a, url: "https://127.0.0.1:1", role: unified, tls: {ca_file: /nonexistent/ca.pem}}]`, "", "backends[0].tls: ca_file"},
		{"tls cert without key", `backends: [{name: a, url: "https://127.0.0.1:1", role: unified, tls: {cert_file: /x.pem}}]`, "", "backends[0].tls: cert_file and key_file"},
		{"tls unknown key", `backends: [{name: a, url: "https://127.0.0.1:1", role: unified, tls: {insecure_skip_verify: true}}]`, "", "insecure_skip_verify"},
		{"duplicate backend", `backends: [{name: a, url: "http://h:1", role: unified}, {name: a, url: "http://h:2", role: unified}]`, "", "duplicate name"},
		{"unpaired prefill", `backends: [{name: a, url: "http://h:1", role: prefill}]`, "", "come in pairs"},
		{"bad tenant key", minimal + "  - {name: bob, key_sha256: nothex}\n", "", "tenants[1].key_sha256"},
		{"same key twice", minimal + "  - {name: bob, key_sha256: \"" + key + "\"}\n", "", "same key"},
		{"bad mode", minimal + "policy: {mode: lenient}\n", "", "policy.mode"},
		{"bad overflow status", minimal + "policy: {overflow_status: 422}\n", "", "policy.overflow_status"},
		{"refuse shared without salts", minimal + "policy: {share_prefix_cache: true, isolation: {refuse_shared: true}}\n", "", "policy.isolation.refuse_shared"},
		{"isolation unknown key", minimal + "policy: {isolation: {refuse_unknown: true}}\n", "", "refuse_unknown"},
		{"drift threshold below one", minimal + "policy: {count_drift: {threshold: -1}}\n", "", "policy.count_drift.threshold"},
		{"drift window too short", minimal + "policy: {count_drift: {window: 10ms}}\n", "", "policy.count_drift.window"},
		{"drift window too long", minimal + "policy: {count_drift: {window: 48h}}\n", "", "policy.count_drift.window"},
		{"bad library", minimal + "tokenizer: {library: hf}\n", "", "tokenizer.library"},
		{"removed library", minimal + "tokenizer: {library: pkoukk}\n", "", `tokenizer.library: "pkoukk" is no longer built in: use kvgate`},
		{"ratio below one", minimal + "tokenizer: {safety_ratio: 0.5}\n", "", "tokenizer.safety_ratio"},
		{"canary without secret", minimal + "canary: {enabled: true}\n", "", "canary.secret"},
		{"bad redis mode", minimal + "state: {redis_mode: ring}\n", "", "state.redis_mode"},
		{"hash tag in key prefix", minimal + "state: {key_prefix: \"app{x}:\"}\n", "", "state.key_prefix"},
		{"negative rpm", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", rpm: -1}\n", "", "tenants[1].rpm"},
		{"negative tpm", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", tpm: -5}\n", "", "tenants[1].tpm"},
		{"negative max prompt bytes", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", max_prompt_bytes: -1}\n", "", "tenants[1].max_prompt_bytes"},
		{"unknown tenant limit", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", rps: 5}\n", "", "rps"},
		{"zero replicas", minimal + "limits: {replicas: -1}\n", "", "limits.replicas"},
		{"long redis timeout", minimal + "limits: {redis_timeout: 1m}\n", "", "limits.redis_timeout"},
		{"zero tenant weight", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", weight: -1}\n", "", "tenants[1].weight"},
		{"nan tenant weight", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", weight: .nan}\n", "", "tenants[1].weight"},
		{"bad queue policy", minimal + "queue: {policy: lottery}\n", "", "queue.policy"},
		{"long queue timeout", minimal + "queue: {timeout: 1h}\n", "", "queue.timeout"},
		{"negative max queued", minimal + "queue: {max_queued: -3}\n", "", "queue.max_queued"},
		{"tiny reply cap", minimal + "upstream: {max_reply_bytes: 10}\n", "", "upstream.max_reply_bytes"},
		{"budget below one reply", minimal + "upstream: {max_reply_bytes: 67108864, max_buffered_bytes: 100000000}\n", "", "upstream.max_buffered_bytes"},
		{"negative budget", minimal + "upstream: {max_buffered_bytes: -1}\n", "", "upstream.max_buffered_bytes"},
		{"bad metrics auth", minimal + "server: {metrics_auth: basic}\n", "", "server.metrics_auth"},
		{"metrics auth without admin key", minimal + "server: {metrics_auth: admin}\n", "", "server.metrics_auth"},
		{"bad metrics key", minimal + "server: {metrics_key_sha256: abc}\n", "", "server.metrics_key_sha256"},
		{"lockout before backoff", minimal + "server: {auth_throttle: {free_failures: 5, lockout_after: 3}}\n", "", "server.auth_throttle"},
		{"negative lockout", minimal + "server: {auth_throttle: {lockout: -1m}}\n", "", "server.auth_throttle"},
		{"bad metrics listen", minimal + "server: {metrics_listen: nowhere}\n", "", "server.metrics_listen"},
		{"metrics listen on the main listener", minimal + "listen: \"127.0.0.1:9000\"\nserver: {metrics_listen: \"127.0.0.1:9000\"}\n", "", "server.metrics_listen"},
		{"bad env int", minimal, "KVGATE_MAX_BODY_BYTES=lots", "KVGATE_MAX_BODY_BYTES"},
		{"bad env duration", minimal, "KVGATE_CANARY_EPOCH=soon", "KVGATE_CANARY_EPOCH"},
		{"misspelt env", minimal, "KVGATE_POLICY_MDOE=monitor", "KVGATE_POLICY_MDOE"},
		{"env for a list", minimal, "KVGATE_BACKENDS=x", "KVGATE_BACKENDS"},
		{"env list with an unknown key", minimal, `KVGATE_TENANTS=[{name: a, key_sha256: "` + key + `", rmp: 5}]`, "KVGATE_TENANTS"},
		{"env list checked like the file", minimal, `KVGATE_BACKENDS=[{name: a, url: "http://h:1", role: mixed}]`, "backends[0].role"},
		{"key of an unknown backend", minimal, "KVGATE_BACKENDS_NOPE_API_KEY=k", "KVGATE_BACKENDS_NOPE_API_KEY"},
		{"secret file missing", minimal, "KVGATE_CANARY_SECRET_FILE=/nonexistent/secret", "KVGATE_CANARY_SECRET_FILE"},
		{"_FILE of no setting", minimal, "KVGATE_CANARY_SECRETS_FILE=/dev/null", "KVGATE_CANARY_SECRETS_FILE"},
		{"env for a section", minimal, "KVGATE_SERVER=x", "KVGATE_SERVER"},
		{"short canary secret", minimal + "canary: {enabled: true, secret: " + strings.Repeat("s", 31) + "}\n", "", "canary.secret: must be at least 32 bytes, got 31"},
		{"short canary secret while off", minimal + "canary: {secret: short}\n", "", "canary.secret"},
		{"short canary secret from env", minimal + "canary: {enabled: true}\n", "KVGATE_CANARY_SECRET=abc", "canary.secret"},
		{"tiny fingerprint index", minimal + "canary: {fingerprints: {max_bytes: 1000}}\n", "", "canary.fingerprints.max_bytes"},
		{"negative cut matches", minimal + "canary: {fingerprints: {cut_matches: -1}}\n", "", "canary.fingerprints.cut_matches"},
		{"one tenant is not boilerplate", minimal + "canary: {fingerprints: {common_tenants: 1}}\n", "", "canary.fingerprints.common_tenants"},
		{"unknown fingerprint mode", minimal + "canary: {fingerprints: {mode: audit}}\n", "", "canary.fingerprints.mode"},
		{"one tenant is no corroboration", minimal + "canary: {fingerprints: {corroboration_tenants: 1}}\n", "", "canary.fingerprints.corroboration_tenants"},
		{"negative corroboration window", minimal + "canary: {fingerprints: {corroboration_window: -1m}}\n", "", "canary.fingerprints.corroboration_window"},
		{"no quarantines per requester", minimal + "canary: {fingerprints: {quarantines_per_requester: -1}}\n", "", "canary.fingerprints.quarantines_per_requester"},
		{"negative incident ttl", minimal + "canary: {incident_ttl: -1h}\n", "", "canary.incident_ttl"},
		{"bad incident ttl from env", minimal, "KVGATE_CANARY_INCIDENT_TTL=forever", "KVGATE_CANARY_INCIDENT_TTL"},
		{"negative drain delay", minimal + "server: {drain_delay: -1s}\n", "", "server.drain_delay"},
		{"negative drain timeout", minimal + "server: {drain_timeout: -5s}\n", "", "server.drain_timeout"},
		{"negative drain timeout from env", minimal, "KVGATE_SERVER_DRAIN_TIMEOUT=-1s", "server.drain_timeout"},
		{"redis url bad scheme", minimal + "state: {redis_url: \"http://127.0.0.1:6379\"}\n", "", "state.redis_url"},
		{"redis url bad db", minimal + "state: {redis_url: \"redis://127.0.0.1:6379/notadb\"}\n", "", "state.redis_url"},
		{"redis url not a url", minimal + "state: {redis_url: \"redis://[::1\"}\n", "", "state.redis_url"},
		{"redis url from env", minimal, "KVGATE_STATE_REDIS_URL=localhost:6379", "state.redis_url"},
		{"sentinel without master", minimal + "state: {redis_url: \"redis://127.0.0.1:26379\", redis_mode: sentinel}\n", "", "master_name"},
		{"cluster bad url", minimal + "state: {redis_url: \"tcp://a:1\", redis_mode: cluster}\n", "", "state.redis_url"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var env []string
			if tc.env != "" {
				env = []string{tc.env}
			}
			_, err := Parse([]byte(tc.yaml), env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

func TestTenantLimitsAndEnv(t *testing.T) {
	y := minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("b", 64) + "\", rpm: 20, tpm: 4000, max_concurrent: 3, max_prompt_bytes: 65536}\n"
	c, err := Parse([]byte(y), []string{"KVGATE_LIMITS_REPLICAS=3", "KVGATE_LIMITS_REDIS_TIMEOUT=50ms"})
	if err != nil {
		t.Fatal(err)
	}
	if b := c.Tenants[1]; b.RPM != 20 || b.TPM != 4000 || b.MaxConcurrent != 3 || b.MaxPromptBytes != 65536 {
		t.Fatalf("tenant limits not read: %+v", b)
	}
	if c.Limits.Replicas != 3 || c.Limits.RedisTimeout != 50*time.Millisecond {
		t.Fatalf("limits overrides not applied: %+v", c.Limits)
	}
	d, _ := Parse([]byte(minimal), nil)
	if d.Limits.Replicas != 1 || d.Limits.RedisTimeout != 100*time.Millisecond || d.Tenants[0].RPM != 0 || d.Tenants[0].MaxPromptBytes != 0 {
		t.Fatalf("limits defaults: %+v", d.Limits)
	}
}

func TestEnvNamesCoverScalarFields(t *testing.T) {
	names := strings.Join(EnvNames(), " ")
	for _, want := range []string{"KVGATE_LISTEN", "KVGATE_CANARY_SECRET", "KVGATE_STATE_REDIS_URL", "KVGATE_POLICY_DEFAULT_MAX_TOKENS",
		"KVGATE_BACKENDS", "KVGATE_TENANTS"} {
		if !strings.Contains(names, want) {
			t.Errorf("%s missing from %s", want, names)
		}
	}
	if strings.Contains(names, "KVGATE_BACKENDS_NAME") || strings.Contains(names, "KVGATE_SERVER ") {
		t.Errorf("a list's fields or a section are not settings of their own: %s", names)
	}
}

// The shipped example must stay a valid configuration.
func TestExampleConfigLoads(t *testing.T) {
	c, err := Load("../examples/kvgate.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 3 || c.Tenants[0].KeySHA256 != SHA256Hex("sk-alice") || c.AdminKeySHA256 != SHA256Hex("admin-example") {
		t.Fatalf("example config drifted: %+v", c)
	}
}

// A zero that means something is honoured, not replaced by the default.
func TestRetriesZeroHonoured(t *testing.T) {
	base := "backends: [{name: u, url: \"http://127.0.0.1:1\", role: unified}]\n"
	for _, c := range []struct {
		yaml string
		env  []string
		want int
	}{
		{base, nil, 1},
		{base + "upstream: {retries: 0}\n", nil, 0},
		{base + "upstream: {retries: 3}\n", nil, 3},
		{base, []string{"KVGATE_UPSTREAM_RETRIES=0"}, 0},
	} {
		cfg, err := Parse([]byte(c.yaml), c.env)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Upstream.Retries != c.want {
			t.Fatalf("%q %v: retries %d, want %d", c.yaml, c.env, cfg.Upstream.Retries, c.want)
		}
	}
}

// Drain settings: defaults, an explicit 0 honoured (file or environment), values read.
func TestDrainSettings(t *testing.T) {
	for _, c := range []struct {
		yaml         string
		env          []string
		delay, limit time.Duration
	}{
		{minimal, nil, 5 * time.Second, 30 * time.Second},
		{minimal + "server: {drain_delay: 0s, drain_timeout: 0s}\n", nil, 0, 0},
		{minimal + "server: {drain_delay: 2s, drain_timeout: 1m}\n", nil, 2 * time.Second, time.Minute},
		{minimal, []string{"KVGATE_SERVER_DRAIN_DELAY=0s", "KVGATE_SERVER_DRAIN_TIMEOUT=90s"}, 0, 90 * time.Second},
	} {
		cfg, err := Parse([]byte(c.yaml), c.env)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Server.DrainDelay != c.delay || cfg.Server.DrainTimeout != c.limit {
			t.Fatalf("%q %v: drain %s/%s, want %s/%s", c.yaml, c.env, cfg.Server.DrainDelay, cfg.Server.DrainTimeout, c.delay, c.limit)
		}
	}
}

// Redis URLs that parse are accepted for each mode, without any connection.
func TestRedisURLAccepted(t *testing.T) {
	for _, y := range []string{
		"state: {redis_url: \"redis://127.0.0.1:1/15\"}\n",
		"state: {redis_url: \"rediss://user:pw@redis.example:6380/0\"}\n",
		"state: {redis_url: \"redis://127.0.0.1:26379?master_name=m&addr=127.0.0.1:26380\", redis_mode: sentinel}\n",
		"state: {redis_url: \"redis://127.0.0.1:7000?addr=127.0.0.1:7001\", redis_mode: cluster}\n",
	} {
		if _, err := Parse([]byte(minimal+y), nil); err != nil {
			t.Errorf("%s: %v", y, err)
		}
	}
}

// A Redis URL error never quotes the URL's password.
func TestRedisURLErrorHidesPassword(t *testing.T) {
	_, err := Parse([]byte(minimal+"state: {redis_url: \"redis://u:hunter2-pw@[::1:6379\"}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "state.redis_url") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("want a state.redis_url error without the password, got %v", err)
	}
}

// Redacted masks every secret and leaves the original alone.
func TestRedacted(t *testing.T) {
	y := `backends:
  - {name: a, url: "http://127.0.0.1:1", role: unified, api_key: engine-key-a}
  - {name: b, url: "http://127.0.0.1:2", role: unified}
canary: {enabled: true, secret: "the canary secret, 32 bytes long"}
`
	for _, c := range []struct{ url, mode, gone, want string }{
		{"redis://user:pw-secret@127.0.0.1:6379/0", "standalone", "pw-secret", "redis://user:REDACTED@127.0.0.1:6379/0"},
		{"redis://pw-secret@127.0.0.1:6379/0", "standalone", "pw-secret", "redis://REDACTED@127.0.0.1:6379/0"},
		{"redis://127.0.0.1:26379?master_name=m&password=pw-secret", "sentinel", "pw-secret", "REDACTED"},
		{"redis://127.0.0.1:6379/0", "standalone", "", "redis://127.0.0.1:6379/0"},
	} {
		cfg, err := Parse([]byte(y+fmt.Sprintf("state: {redis_url: %q, redis_mode: %s}\n", c.url, c.mode)), nil)
		if err != nil {
			t.Fatal(err)
		}
		r := cfg.Redacted()
		if r.Canary.Secret != "REDACTED" || r.Backends[0].APIKey != "REDACTED" || r.Backends[1].APIKey != "" {
			t.Fatalf("secrets not redacted: %+v %+v", r.Canary, r.Backends)
		}
		if (c.gone != "" && strings.Contains(r.State.RedisURL, c.gone)) || !strings.Contains(r.State.RedisURL, c.want) {
			t.Fatalf("redis url %q redacted to %q", c.url, r.State.RedisURL)
		}
		if cfg.Canary.Secret != "the canary secret, 32 bytes long" || cfg.Backends[0].APIKey != "engine-key-a" || cfg.State.RedisURL != c.url {
			t.Fatal("Redacted changed the original")
		}
	}
}

// A bad environment variable and a bad file are named in one error, not one per run.
func TestEnvAndFileErrorsTogether(t *testing.T) {
	_, err := Parse([]byte(minimal+"server: {drain_timeout: -1s}\n"), []string{"KVGATE_LISTN=x", "KVGATE_BIN=/bin/kvgate"})
	if err == nil || !strings.Contains(err.Error(), "KVGATE_LISTN") || !strings.Contains(err.Error(), "server.drain_timeout") || strings.Contains(err.Error(), "KVGATE_BIN") {
		t.Fatalf("want both KVGATE_LISTN and server.drain_timeout named (and KVGATE_BIN, a test tool's, not), got %v", err)
	}
}

// Backend URLs: the scheme's default port, https, and a trailing slash are accepted.
func TestBackendAddress(t *testing.T) {
	for url, want := range map[string]string{
		"http://localhost":        "http localhost:80",
		"https://engine.internal": "https engine.internal:443",
		"http://127.0.0.1:30000/": "http 127.0.0.1:30000",
		"https://[::1]:8443":      "https [::1]:8443",
	} {
		scheme, addr, err := Backend{URL: url}.Address()
		if err != nil || scheme+" "+addr != want {
			t.Errorf("%s: got %q %q %v, want %s", url, scheme, addr, err, want)
		}
	}
}

// A model's tokenizer takes the top-level settings it does not set.
func TestModelTokenizerInherits(t *testing.T) {
	c, err := Parse([]byte("backends: [{name: a, url: \"http://h:1\", role: unified, model: m}, {name: b, url: \"http://h:2\", role: unified, model: n}]\n"+
		"models: [{name: m, tokenizer: {encoding: o200k_base}}, {name: n}]\ntokenizer: {safety_ratio: 1.5}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tk := c.ModelTokenizer("m"); tk.Encoding != "o200k_base" || tk.SafetyRatio != 1.5 || tk.Library != LibraryKvgate || tk.ExactTimeout != c.Tokenizer.ExactTimeout {
		t.Fatalf("model m's tokenizer: %+v", tk)
	}
	if tk := c.ModelTokenizer("n"); tk != c.Tokenizer {
		t.Fatalf("model n (no tokenizer of its own) takes the top-level tokenizer: %+v", tk)
	}
	if names := c.ModelNames(); strings.Join(names, ",") != "m,n" {
		t.Fatalf("ModelNames: %v", names)
	}
}

// docs/fleet.yaml (the README's two-model, discovered, TLS example) loads once its
// certificate files exist: a CA and a client certificate made here stand for /etc/kvgate's.
func TestFleetExampleLoads(t *testing.T) {
	raw, err := os.ReadFile("../docs/fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for name, body := range map[string][]byte{"engines-ca.pem": certPEM, "gw.pem": certPEM,
		"gw-key.pem": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Parse([]byte(strings.ReplaceAll(string(raw), "/etc/kvgate", dir)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.MultiModel() || strings.Join(c.ModelNames(), ",") != "qwen3-32b,llama-3.1-8b" || c.Backends[0].Discover != "dns" ||
		!c.Reload.Watch || c.ModelTokenizer("llama-3.1-8b").Encoding != "o200k_base" {
		t.Fatalf("fleet example: %+v", c)
	}
	// Without the files it is refused, naming the key.
	if _, err := Parse(raw, nil); err == nil || !strings.Contains(err.Error(), "backends[0].tls: ca_file") {
		t.Fatalf("missing ca_file: %v", err)
	}
}

// Lists, backend keys and _FILE variants from the environment: what a deployment that keeps every
// secret out of the file needs.
func TestEnvListsKeysAndFiles(t *testing.T) {
	dir := t.TempDir()
	secretFile := dir + "/canary"
	const secret = "a canary secret read from a file, 32+"
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := dir + "/engine-key"
	if err := os.WriteFile(keyFile, []byte("engine-key-from-file"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		`KVGATE_BACKENDS=[{name: gpu-a, url: "http://127.0.0.1:1", role: unified}, {name: gpu.b, url: "http://127.0.0.1:2", role: unified}]`,
		`KVGATE_TENANTS=[{"name": "carol", "key_sha256": "` + key + `", "rpm": 7}]`,
		"KVGATE_BACKENDS_GPU_A_API_KEY=engine-key-a",
		"KVGATE_BACKENDS_GPU_B_API_KEY_FILE=" + keyFile,
		"KVGATE_CANARY_ENABLED=true",
		"KVGATE_CANARY_SECRET_FILE=" + secretFile,
	}
	c, err := Parse([]byte(minimal), env)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 2 || c.Backends[0].Name != "gpu-a" || c.Backends[0].APIKey != "engine-key-a" ||
		c.Backends[1].APIKey != "engine-key-from-file" {
		t.Fatalf("backends from the environment: %+v", c.Backends)
	}
	if len(c.Tenants) != 1 || c.Tenants[0].Name != "carol" || c.Tenants[0].RPM != 7 {
		t.Fatalf("tenants from the environment: %+v", c.Tenants)
	}
	if c.Canary.Secret != secret {
		t.Fatalf("canary secret from a file: %q (the trailing newline must go)", c.Canary.Secret)
	}
	// A value set twice (plain and _FILE) is refused, naming both, and no value is quoted.
	_, err = Parse([]byte(minimal), []string{"KVGATE_CANARY_SECRET=" + strings.Repeat("x", 40), "KVGATE_CANARY_SECRET_FILE=" + secretFile})
	if err == nil || !strings.Contains(err.Error(), "KVGATE_CANARY_SECRET and KVGATE_CANARY_SECRET_FILE") || strings.Contains(err.Error(), "xxxx") {
		t.Fatalf("want both variables named, got %v", err)
	}
	// Two backends whose names map to one variable: the variable is refused rather than guessed.
	_, err = Parse([]byte(`backends: [{name: a-1, url: "http://h:1", role: unified}, {name: a.1, url: "http://h:2", role: unified}]`),
		[]string{"KVGATE_BACKENDS_A_1_API_KEY=k"})
	if err == nil || !strings.Contains(err.Error(), "both map to this name") {
		t.Fatalf("want the ambiguity named, got %v", err)
	}
}

// tokenizer.hf_dir must hold the model's two tokenizer files: a missing directory or file is a
// configuration error naming the key and the file.
func TestHFDirNeedsBothFiles(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ dir, file string }{
		{dir + "/nope", "tokenizer.json"}, {dir, "tokenizer.json"},
	} {
		_, err := Parse([]byte(minimal+fmt.Sprintf("tokenizer: {hf_dir: %q}\n", c.dir)), nil)
		if err == nil || !strings.Contains(err.Error(), "tokenizer.hf_dir") || !strings.Contains(err.Error(), c.file) {
			t.Fatalf("hf_dir %s: err = %v", c.dir, err)
		}
	}
	if err := os.WriteFile(dir+"/tokenizer.json", []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse([]byte(minimal+fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir)), nil); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Fatalf("err = %v", err)
	}
	if err := os.WriteFile(dir+"/tokenizer_config.json", []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(minimal+fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir)), nil)
	if err != nil || c.Tokenizer.HFDir != dir {
		t.Fatalf("both files present: %v", err)
	}
}

// Issue 31: /metrics needs a key by default; a configuration in which no key could read it is
// valid (the gateway serves) but warned about, naming what to set.
func TestMetricsKeyWarning(t *testing.T) {
	for _, tc := range []struct {
		extra string
		warn  bool
	}{
		{"", true},
		{"admin_key_sha256: \"" + key + "\"\n", false},
		{"server: {metrics_key_sha256: \"" + key + "\"}\n", false},
		{"server: {metrics_auth: none}\n", false},
	} {
		c, err := Parse([]byte(minimal+tc.extra), nil)
		if err != nil {
			t.Fatal(err)
		}
		w := strings.Join(c.Warnings(), "\n")
		if tc.warn != strings.Contains(w, "server.metrics_key_sha256") {
			t.Errorf("%q: warnings %q", tc.extra, w)
		}
	}
}
