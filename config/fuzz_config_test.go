package config

import (
	"os"
	"testing"
	"time"
)

// FuzzParse: any bytes either fail with an error or give a config that validates again and whose
// every duration, size and count that the gateway hands to a ticker, a timer, a semaphore or a
// server limit is positive (time.NewTicker panics on a non-positive interval; a negative timeout
// fails every call at once).
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../examples/kvgate.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"backends: [{name: a, url: \"http://127.0.0.1:1\", role: unified}]\n",
		"backends: [{name: a, url: \"http://127.0.0.1:1\", role: unified}]\ncapacity: {poll_interval: 2s, max_age: 6s, timeout: 1s}\n",
		"backends: [{name: a, url: \"http://127.0.0.1:1\", role: unified}]\nupstream: {response_header_timeout: 300s, idle_timeout: 60s, max_conns: 10}\n",
		"backends: [{name: a, url: \"http://127.0.0.1:1\", role: unified}]\ncanary: {enabled: true, secret: a-secret-of-at-least-thirty-two-bytes, epoch: 1h, detect_window: 2h, quarantine_ttl: 15m}\n",
		"backends: [{name: a, url: \"http://127.0.0.1:1\", role: unified}]\ntokenizer: {exact_timeout: 2s, exact_concurrency: 4}\nlimits: {redis_timeout: 100ms}\n",
		"backends: [{name: a, url: \"http://127.0.0.1:1\", role: unified}]\nserver: {header_timeout: 10s, read_timeout: 30s, idle_timeout: 2m, max_header_bytes: 16384, max_conns: 100}\n",
		"backends: [{name: p, url: \"http://h:1\", role: prefill}, {name: d, url: \"http://h:2\", role: decode}]\ntenants: [{name: t, key_sha256: \"" +
			"099295a3784e1bd368dc348843a7398c1931b6b8ec2504c73e91ed2040bdc46c\", rpm: 5}]\n",
		"{}", "- a\n- b\n", "backends: &a [*a]\n", "listen: [1, 2]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := Parse(raw, nil)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("a parsed config does not validate again: %v", err)
		}
		for name, d := range map[string]time.Duration{
			"capacity.poll_interval": c.Capacity.PollInterval, "capacity.max_age": c.Capacity.MaxAge,
			"capacity.timeout": c.Capacity.Timeout, "upstream.response_header_timeout": c.Upstream.ResponseHeaderTimeout,
			"upstream.idle_timeout": c.Upstream.IdleTimeout, "tokenizer.exact_timeout": c.Tokenizer.ExactTimeout,
			"tokenizer.calibration_retry_max": c.Tokenizer.CalibrationRetryMax,
			"canary.epoch":                    c.Canary.Epoch, "canary.detect_window": c.Canary.DetectWindow,
			"canary.quarantine_ttl": c.Canary.QuarantineTTL, "limits.redis_timeout": c.Limits.RedisTimeout,
			"server.header_timeout": c.Server.HeaderTimeout, "server.read_timeout": c.Server.ReadTimeout,
			"server.idle_timeout": c.Server.IdleTimeout,
		} {
			if d <= 0 {
				t.Fatalf("%s = %s accepted:\n%s", name, d, raw)
			}
		}
		for name, n := range map[string]int{
			"max_body_bytes": c.MaxBodyBytes, "upstream.max_conns": c.Upstream.MaxConns,
			"upstream.max_event_bytes": c.Upstream.MaxEventBytes, "tokenizer.exact_concurrency": c.Tokenizer.ExactConcurrency,
			"limits.replicas": c.Limits.Replicas, "server.max_conns": c.Server.MaxConns, "server.max_header_bytes": c.Server.MaxHeaderBytes,
		} {
			if n <= 0 {
				t.Fatalf("%s = %d accepted:\n%s", name, n, raw)
			}
		}
		if c.Listen == "" || len(c.Backends) == 0 {
			t.Fatalf("no listen address or backends:\n%s", raw)
		}
	})
}
