package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// run runs the product binary with env added to the test's, bounded in time, and returns its
// exit status, stdout and stderr.
func run(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, procs.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), stdout.String(), stderr.String()
	default:
		t.Fatalf("%v: %v", args, err)
		return -1, "", ""
	}
}

// kvgate check (and its other name, check-config): a valid file exits 0 and prints the effective
// configuration (defaults and environment applied, secrets read from _FILE variables) with every
// secret redacted, in a form that loads again; an invalid one exits 2 naming every bad key.
func TestCheckConfig(t *testing.T) {
	for _, cmd := range []string{"check", "check-config"} {
		t.Run(cmd, func(t *testing.T) { testCheck(t, cmd) })
	}
}

func testCheck(t *testing.T, cmd string) {
	good := writeConfig(t, fmt.Sprintf(`backends:
  - {name: u, url: "http://127.0.0.1:1", role: unified, api_key: engine-key-not-for-logs}
tenants: [{name: alice, key_sha256: %q}]
state: {redis_url: "redis://:redis-pw-not-for-logs@127.0.0.1:6379/15"}
canary: {secret: "canary secret not for logs, 32 bytes+"}
`, config.SHA256Hex("sk-alice")))
	keyFile := filepath.Join(t.TempDir(), "engine-key")
	if err := os.WriteFile(keyFile, []byte("engine-key-2-not-for-logs\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, []string{"KVGATE_SERVER_DRAIN_TIMEOUT=45s", "KVGATE_BACKENDS_U_API_KEY_FILE=" + keyFile}, cmd, "--config", good)
	if code != 0 {
		t.Fatalf("a valid file: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"drain_timeout: 45s", "drain_delay: 5s", "listen: 127.0.0.1:8080", "api_key: REDACTED",
		"secret: REDACTED", "redis://:REDACTED@127.0.0.1:6379/15"} {
		if !strings.Contains(out, want) {
			t.Errorf("effective configuration lacks %q:\n%s", want, out)
		}
	}
	// Issue 31: valid, but no key could read /metrics (it needs one by default): said on stderr.
	if !strings.Contains(errOut, "warning: server.metrics_auth: key") || !strings.Contains(errOut, "server.metrics_key_sha256") {
		t.Errorf("no warning about the /metrics key:\n%s", errOut)
	}
	for _, secret := range []string{"engine-key-not-for-logs", "redis-pw-not-for-logs", "canary secret not for logs, 32 bytes+"} {
		if strings.Contains(out+errOut, secret) {
			t.Fatalf("a secret was printed: %q\n%s", secret, out)
		}
	}
	// The printed configuration is itself valid (durations, enumerations as the loader reads them),
	// once the redacted secrets are put back to something acceptable.
	again := strings.ReplaceAll(out, "secret: REDACTED", "secret: another-canary-secret-of-32-bytes-min")
	if _, err := config.Parse([]byte(again), nil); err != nil {
		t.Fatalf("check-config's output does not load: %v\n%s", err, out)
	}

	bad := writeConfig(t, `backends: [{name: u, url: "http://127.0.0.1:1", role: unified}]
canary: {enabled: true, secret: short}
state: {redis_url: "http://not-redis:6379"}
server: {drain_delay: -1s}
`)
	code, out, errOut = run(t, []string{"KVGATE_POLICY_MDOE=monitor", "KVGATE_BACKENDS_NOPE_API_KEY=x"}, cmd, "--config", bad)
	if code != 2 || out != "" {
		t.Fatalf("an invalid file: exit %d, stdout %q", code, out)
	}
	for _, want := range []string{"KVGATE_POLICY_MDOE", "KVGATE_BACKENDS_NOPE_API_KEY", "canary.secret: must be at least 32 bytes",
		"state.redis_url", "server.drain_delay"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the errors do not name %s:\n%s", want, errOut)
		}
	}
	if code, _, errOut := run(t, nil, cmd, "--config", "/nonexistent/kvgate.yaml"); code != 2 || !strings.Contains(errOut, "reading config") {
		t.Fatalf("a missing file: exit %d %s", code, errOut)
	}
}

// --help is a request, not an error: usage on stdout, exit 0. A bad flag is exit 2.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"serve", "--help"}, {"serve", "-h"}, {"check", "--help"}, {"check-config", "--help"}, {"--help"}} {
		code, out, errOut := run(t, nil, args...)
		if code != 0 || !strings.Contains(out, "usage: kvgate") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if code, _, errOut := run(t, nil, "serve", "--bogus"); code != 2 || !strings.Contains(errOut, "bogus") {
		t.Errorf("a bad flag: exit %d %s", code, errOut)
	}
}

// A misspelt KVGATE_* variable refuses the start, naming it, instead of being ignored.
func TestServeRefusesUnknownEnv(t *testing.T) {
	cfg := writeConfig(t, fmt.Sprintf("listen: \"127.0.0.1:%d\"\nbackends: [{name: u, url: \"http://127.0.0.1:1\", role: unified}]\n", procs.FreePort(t)))
	code, _, errOut := run(t, []string{"KVGATE_CANARY_SECRETT=typo-of-the-secret-name"}, "serve", "--config", cfg)
	if code != 2 || !strings.Contains(errOut, "KVGATE_CANARY_SECRETT") || strings.Contains(errOut, "typo-of-the-secret-name") {
		t.Fatalf("want exit 2 naming the variable (not its value), got %d:\n%s", code, errOut)
	}
}
