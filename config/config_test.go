package config

import (
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
		c.Tokenizer.Library != "tiktoken-go" || c.Tokenizer.SafetyRatio != 1.3 ||
		c.State.RedisMode != "standalone" || c.Canary.Epoch != time.Hour || c.Capacity.MaxAge != 6*time.Second ||
		c.Upstream.MaxReplyBytes != 64<<20 || c.Upstream.MaxBufferedBytes != 256<<20 ||
		c.Server.MetricsAuth != MetricsAuthNone || c.Server.MetricsListen != "" {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestEnvOverrides(t *testing.T) {
	env := []string{
		"KVGATE_LISTEN=127.0.0.1:9999",
		"KVGATE_POLICY_MODE=monitor",
		"KVGATE_TOKENIZER_SAFETY_RATIO=1.5",
		"KVGATE_CANARY_ENABLED=true",
		"KVGATE_CANARY_SECRET=s3cret",
		"KVGATE_CAPACITY_POLL_INTERVAL=500ms",
		"KVGATE_UNKNOWN_THING=ignored",
		"PATH=/bin",
	}
	c, err := Parse([]byte(minimal), env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9999" || c.Policy.Mode != "monitor" || c.Tokenizer.SafetyRatio != 1.5 ||
		!c.Canary.Enabled || c.Canary.Secret != "s3cret" || c.Capacity.PollInterval != 500*time.Millisecond {
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
		{"duplicate backend", `backends: [{name: a, url: "http://h:1", role: unified}, {name: a, url: "http://h:2", role: unified}]`, "", "duplicate name"},
		{"unpaired prefill", `backends: [{name: a, url: "http://h:1", role: prefill}]`, "", "come in pairs"},
		{"bad tenant key", minimal + "  - {name: bob, key_sha256: nothex}\n", "", "tenants[1].key_sha256"},
		{"same key twice", minimal + "  - {name: bob, key_sha256: \"" + key + "\"}\n", "", "same key"},
		{"bad mode", minimal + "policy: {mode: lenient}\n", "", "policy.mode"},
		{"bad library", minimal + "tokenizer: {library: hf}\n", "", "tokenizer.library"},
		{"ratio below one", minimal + "tokenizer: {safety_ratio: 0.5}\n", "", "tokenizer.safety_ratio"},
		{"canary without secret", minimal + "canary: {enabled: true}\n", "", "canary.secret"},
		{"bad redis mode", minimal + "state: {redis_mode: ring}\n", "", "state.redis_mode"},
		{"negative rpm", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", rpm: -1}\n", "", "tenants[1].rpm"},
		{"negative tpm", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", tpm: -5}\n", "", "tenants[1].tpm"},
		{"unknown tenant limit", minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("a", 64) + "\", rps: 5}\n", "", "rps"},
		{"zero replicas", minimal + "limits: {replicas: -1}\n", "", "limits.replicas"},
		{"long redis timeout", minimal + "limits: {redis_timeout: 1m}\n", "", "limits.redis_timeout"},
		{"tiny reply cap", minimal + "upstream: {max_reply_bytes: 10}\n", "", "upstream.max_reply_bytes"},
		{"budget below one reply", minimal + "upstream: {max_reply_bytes: 67108864, max_buffered_bytes: 100000000}\n", "", "upstream.max_buffered_bytes"},
		{"negative budget", minimal + "upstream: {max_buffered_bytes: -1}\n", "", "upstream.max_buffered_bytes"},
		{"bad metrics auth", minimal + "server: {metrics_auth: basic}\n", "", "server.metrics_auth"},
		{"metrics auth without admin key", minimal + "server: {metrics_auth: admin}\n", "", "server.metrics_auth"},
		{"bad metrics listen", minimal + "server: {metrics_listen: nowhere}\n", "", "server.metrics_listen"},
		{"metrics listen on the main listener", minimal + "listen: \"127.0.0.1:9000\"\nserver: {metrics_listen: \"127.0.0.1:9000\"}\n", "", "server.metrics_listen"},
		{"bad env int", minimal, "KVGATE_MAX_BODY_BYTES=lots", "KVGATE_MAX_BODY_BYTES"},
		{"bad env duration", minimal, "KVGATE_CANARY_EPOCH=soon", "KVGATE_CANARY_EPOCH"},
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
	y := minimal + "  - {name: bob, key_sha256: \"" + strings.Repeat("b", 64) + "\", rpm: 20, tpm: 4000, max_concurrent: 3}\n"
	c, err := Parse([]byte(y), []string{"KVGATE_LIMITS_REPLICAS=3", "KVGATE_LIMITS_REDIS_TIMEOUT=50ms"})
	if err != nil {
		t.Fatal(err)
	}
	if b := c.Tenants[1]; b.RPM != 20 || b.TPM != 4000 || b.MaxConcurrent != 3 {
		t.Fatalf("tenant limits not read: %+v", b)
	}
	if c.Limits.Replicas != 3 || c.Limits.RedisTimeout != 50*time.Millisecond {
		t.Fatalf("limits overrides not applied: %+v", c.Limits)
	}
	d, _ := Parse([]byte(minimal), nil)
	if d.Limits.Replicas != 1 || d.Limits.RedisTimeout != 100*time.Millisecond || d.Tenants[0].RPM != 0 {
		t.Fatalf("limits defaults: %+v", d.Limits)
	}
}

func TestEnvNamesCoverScalarFields(t *testing.T) {
	names := strings.Join(EnvNames(), " ")
	for _, want := range []string{"KVGATE_LISTEN", "KVGATE_CANARY_SECRET", "KVGATE_STATE_REDIS_URL", "KVGATE_POLICY_DEFAULT_MAX_TOKENS"} {
		if !strings.Contains(names, want) {
			t.Errorf("%s missing from %s", want, names)
		}
	}
	if strings.Contains(names, "KVGATE_BACKENDS") {
		t.Errorf("lists must not be env-overridable: %s", names)
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
