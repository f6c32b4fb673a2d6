package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// status posts a small /generate as key and returns the status.
func status(t *testing.T, base, key string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/generate", strings.NewReader(`{"text":"hello","sampling_params":{"max_new_tokens":2}}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func waitUntil(t *testing.T, within time.Duration, what string, logs *syncBuf, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s\n%s", within, what, logs.String())
		}
	}
}

// SIGHUP to a real `kvgate serve` while a stream runs: the file now has a second backend and a
// second tenant. The stream finishes whole on its engine; the new tenant is served, the new
// engine takes traffic once polled. Then an invalid file: logged, the running configuration kept.
func TestSIGHUPReloadsWhileStreaming(t *testing.T) {
	a := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "50ms")
	b := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	port := procs.FreePort(t)
	head := fmt.Sprintf("listen: \"127.0.0.1:%d\"\ncapacity: {poll_interval: 200ms}\nserver: {drain_delay: 0s}\n", port)
	alice := fmt.Sprintf("  - {name: alice, key_sha256: %q}\n", config.SHA256Hex("sk-alice"))
	bob := fmt.Sprintf("  - {name: bob, key_sha256: %q}\n", config.SHA256Hex("sk-bob"))
	path := writeConfig(t, head+fmt.Sprintf("backends:\n  - {name: a, url: %q, role: unified}\ntenants:\n", a.URL)+alice)
	logs := &syncBuf{}
	cmd, base := startServe(t, path, port, logs)
	defer cmd.Process.Kill()
	if got := status(t, base, "sk-bob"); got != 401 {
		t.Fatalf("bob before the reload: %d", got)
	}

	req, _ := http.NewRequest("POST", base+"/generate", strings.NewReader(`{"text":"a long story","sampling_params":{"max_new_tokens":40},"stream":true}`))
	req.Header.Set("Authorization", "Bearer sk-alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", err, resp)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(path, []byte(head+fmt.Sprintf("backends:\n  - {name: a, url: %q, role: unified}\n  - {name: b, url: %q, role: unified}\ntenants:\n", a.URL, b.URL)+alice+bob), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 5*time.Second, "bob served after SIGHUP", logs, func() bool { return status(t, base, "sk-bob") == 200 })
	waitUntil(t, 10*time.Second, "the new backend takes traffic", logs, func() bool {
		_ = status(t, base, "sk-bob")
		return b.Stats(t).Requests["/generate"] > 0
	})
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Contains(string(rest), `"error"`) {
		t.Fatalf("the stream in flight across the reload: %v %.300q", err, rest)
	}

	if err := os.WriteFile(path, []byte(head+"backends:\n  - {name: a, url: \"ftp://nowhere\", role: unified}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 5*time.Second, "the invalid file is logged", logs, func() bool {
		return strings.Contains(logs.String(), "reload: the configuration file is invalid") && strings.Contains(logs.String(), "backends[0].url")
	})
	if status(t, base, "sk-bob") != 200 || status(t, base, "sk-alice") != 200 {
		t.Fatalf("after an invalid reload the running configuration must stay:\n%s", logs.String())
	}
	if cmd.ProcessState != nil {
		t.Fatal("serve exited")
	}
}

// reload.watch: writing the file is enough (no signal): a tenant removed from it is refused.
func TestReloadWatchesTheFile(t *testing.T) {
	a := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	port := procs.FreePort(t)
	head := fmt.Sprintf("listen: \"127.0.0.1:%d\"\ncapacity: {poll_interval: 200ms}\nserver: {drain_delay: 0s}\nreload: {watch: true}\nbackends:\n  - {name: a, url: %q, role: unified}\ntenants:\n", port, a.URL)
	alice := fmt.Sprintf("  - {name: alice, key_sha256: %q}\n", config.SHA256Hex("sk-alice"))
	bob := fmt.Sprintf("  - {name: bob, key_sha256: %q}\n", config.SHA256Hex("sk-bob"))
	path := writeConfig(t, head+alice+bob)
	logs := &syncBuf{}
	cmd, base := startServe(t, path, port, logs)
	defer cmd.Process.Kill()
	if status(t, base, "sk-bob") != 200 {
		t.Fatal("bob before the change")
	}
	// Written as editors do: a new file renamed over the old one.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(head+alice), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "bob refused once the file dropped him", logs, func() bool { return status(t, base, "sk-bob") == 401 })
	if status(t, base, "sk-alice") != 200 {
		t.Fatal("alice after the change")
	}
}

// scrapeGauge reads one unlabelled series from /metrics (scrape key "scrape-key").
func scrapeGauge(t *testing.T, base, name string) float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer scrape-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics:\n%s", name, body)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Issue 51: a reload logs which settings changed (secrets redacted), and
// kvgate_config_last_reload_successful says whether the last one took.
func TestReloadLogsDiffAndGauge(t *testing.T) {
	a := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	port := procs.FreePort(t)
	head := fmt.Sprintf("listen: \"127.0.0.1:%d\"\ncapacity: {poll_interval: 200ms}\nserver: {drain_delay: 0s, metrics_key_sha256: %q}\nbackends:\n  - {name: a, url: %q, role: unified}\n", port, config.SHA256Hex("scrape-key"), a.URL)
	const oldSecret, newSecret = "old-canary-secret-0123456789abcdef", "new-canary-secret-0123456789abcdef"
	first := head + "canary: {secret: " + oldSecret + "}\ntenants:\n" + fmt.Sprintf("  - {name: alice, key_sha256: %q, rpm: 5}\n  - {name: carol, key_sha256: %q}\n", config.SHA256Hex("sk-alice"), config.SHA256Hex("sk-carol"))
	path := writeConfig(t, first)
	logs := &syncBuf{}
	cmd, base := startServe(t, path, port, logs)
	defer cmd.Process.Kill()
	if v := scrapeGauge(t, base, "kvgate_config_last_reload_successful"); v != 1 {
		t.Fatalf("kvgate_config_last_reload_successful at start = %v, want 1", v)
	}
	started := scrapeGauge(t, base, "kvgate_config_last_reload_success_timestamp_seconds")

	second := head + "policy: {mode: monitor}\ncanary: {secret: " + newSecret + "}\ntenants:\n" + fmt.Sprintf("  - {name: alice, key_sha256: %q, rpm: 10}\n  - {name: bob, key_sha256: %q}\n", config.SHA256Hex("sk-alice2"), config.SHA256Hex("sk-bob"))
	if err := os.WriteFile(path, []byte(second), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the timestamp gauge has a resolution finer than this; the wait makes it move visibly
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 10*time.Second, "the reload's diff is logged", logs, func() bool { return strings.Contains(logs.String(), "reload: configuration changes") })
	out := logs.String()
	for _, want := range []string{
		`"policy.mode: \"enforce\" → \"monitor\""`,
		`"tenants[alice].key_sha256: changed (secret)"`,
		`"tenants[alice].rpm: 5 → 10"`,
		`"tenants[carol]: removed"`,
		`"tenants[bob]: added"`,
		`"canary.secret: changed (secret)"`,
		`"count":6`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the reload log lacks %s:\n%s", want, out)
		}
	}
	for _, secret := range []string{oldSecret, newSecret, config.SHA256Hex("sk-alice2")} {
		if strings.Contains(out, secret) {
			t.Errorf("a secret (%.8s…) is in the logs:\n%s", secret, out)
		}
	}
	if v := scrapeGauge(t, base, "kvgate_config_last_reload_successful"); v != 1 {
		t.Fatalf("after a good reload: %v, want 1", v)
	}
	if at := scrapeGauge(t, base, "kvgate_config_last_reload_success_timestamp_seconds"); at <= started {
		t.Fatalf("success timestamp %v did not move past the start's %v", at, started)
	}

	// A bad file: the gauge drops to 0 and stays until a reload succeeds.
	if err := os.WriteFile(path, []byte(second+"lsiten: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 10*time.Second, "the invalid file is logged with the suggestion", logs, func() bool {
		return strings.Contains(logs.String(), `did you mean \"listen\"?`)
	})
	if v := scrapeGauge(t, base, "kvgate_config_last_reload_successful"); v != 0 {
		t.Fatalf("after a failed reload: %v, want 0", v)
	}
	if err := os.WriteFile(path, []byte(second), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitUntil(t, 10*time.Second, "the unchanged reload logs count 0", logs, func() bool {
		return strings.Contains(logs.String(), `"count":0`)
	})
	if v := scrapeGauge(t, base, "kvgate_config_last_reload_successful"); v != 1 {
		t.Fatalf("after a good reload: %v, want 1", v)
	}
}
