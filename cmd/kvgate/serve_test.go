package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// startServe starts `kvgate serve --config cfg` listening on port, its output in logs, and
// waits until /readyz answers 200; it returns the process and the base URL.
func startServe(t *testing.T, cfg string, port int, logs *syncBuf, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(procs.Binary(t), "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if r, err := http.Get(base + "/readyz"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return cmd, base
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("serve not ready:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeConfig(t *testing.T, yaml string) string {
	p := filepath.Join(t.TempDir(), "kvgate.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// `kvgate serve` as a process: it serves, writes JSON access lines without keys, and drains and
// exits 0 on SIGTERM.
func TestServeProcess(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
server: {drain_delay: 100ms, metrics_key_sha256: %q}
`, port, sim.URL, config.SHA256Hex("sk-secret-alice"), config.SHA256Hex("scrape-key")))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	req, _ := http.NewRequest("POST", base+"/generate", strings.NewReader(`{"text":"hello","sampling_params":{"max_new_tokens":2}}`))
	req.Header.Set("Authorization", "Bearer sk-secret-alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request through serve: %v %v", err, resp)
	}
	resp.Body.Close()
	// kvgate_build_info carries the version the binary reports.
	_, v, _ := run(t, nil, "version")
	mreq, _ := http.NewRequest("GET", base+"/metrics", nil)
	mreq.Header.Set("Authorization", "Bearer scrape-key")
	mr, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	want := `version="` + strings.TrimSpace(strings.TrimPrefix(v, "kvgate ")) + `"} 1`
	if !regexp.MustCompile(`(?m)^kvgate_build_info\{go_version="go[^"]+",revision="[^"]+",` + regexp.QuoteMeta(want) + `$`).Match(metrics) {
		t.Errorf("kvgate_build_info lacks %s:\n%s", want, regexp.MustCompile(`(?m)^kvgate_build_info.*$`).Find(metrics))
	}
	// Built from a git checkout (make build, or this test's own build), the revision is the
	// checkout's commit, not "unknown" (issue 51: GOFLAGS=-buildvcs=false had hidden it).
	if root, err := procs.ModuleRoot(); err == nil {
		if head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
			rev := regexp.MustCompile(`(?m)^kvgate_build_info\{[^}]*revision="([^"]*)"`).FindSubmatch(metrics)
			if rev == nil || !strings.HasPrefix(string(rev[1]), strings.TrimSpace(string(head))) {
				t.Errorf("kvgate_build_info revision %q, want the checkout's HEAD %s", rev, head)
			}
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve did not exit 0 on SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
	out := logs.String()
	if !strings.Contains(out, `"logger":"access"`) || !strings.Contains(out, `"tenant":"alice"`) || !strings.Contains(out, `"tier":"bound"`) {
		t.Fatalf("no JSON access line:\n%s", out)
	}
	if strings.Contains(out, "sk-secret-alice") {
		t.Fatal("the API key appeared in the logs")
	}
	if !strings.Contains(out, "KV pool is smaller than the advertised context") {
		t.Fatalf("a pool below the context must be logged loudly:\n%s", out)
	}
}

// policy.strict refuses to start in front of a pool smaller than its context.
func TestServeStrictRefusesSmallPool(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
policy: {strict: true}
`, procs.FreePort(t), sim.URL))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, procs.Binary(t), "serve", "--config", cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "policy.strict") {
		t.Fatalf("want a refusal naming policy.strict, got %v:\n%s", err, out)
	}
}

// A config error names the field and exits 2.
func TestServeBadConfig(t *testing.T) {
	cfg := writeConfig(t, "backends: [{name: x, url: \"http://127.0.0.1:1\", role: mixed}]\n")
	out, err := exec.Command(procs.Binary(t), "serve", "--config", cfg).CombinedOutput()
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "backends[0].role") {
		t.Fatalf("want exit 2 naming backends[0].role, got %v:\n%s", err, out)
	}
}
