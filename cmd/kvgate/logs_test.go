package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// privateRedis runs a redis-server on a free port (nothing on disk); stop kills it.
func privateRedis(t *testing.T) (url string, stop func()) {
	t.Helper()
	port := procs.FreePort(t)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server: %v (install Debian's redis-server)", err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer c.Close()
	for deadline := time.Now().Add(5 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatal("private redis-server did not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Sprintf("redis://127.0.0.1:%d/0", port), stop
}

// Every line `kvgate serve` writes is one JSON object with an ISO-8601 "ts", also while its Redis
// is gone (go-redis's own messages arrive as rate-limited structured warnings, not plain text),
// and the access lines carry the client's address, method, model and usage.
func TestServeLogsStayJSONThroughRedisOutage(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	redisURL, stopRedis := privateRedis(t)
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q, rpm: 100000, tpm: 10000000, max_concurrent: 50}]
capacity: {poll_interval: 200ms}
state: {redis_url: %q, key_prefix: "kvgate-logs-test:"}
limits: {redis_timeout: 50ms}
server: {drain_delay: 100ms}
`, port, sim.URL, config.SHA256Hex("sk-secret-alice"), redisURL))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	send := func() int {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":3}`))
		req.Header.Set("Authorization", "Bearer sk-secret-alice")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request through serve: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := send(); s != 200 {
		t.Fatalf("before the outage: %d\n%s", s, logs.String())
	}
	stopRedis()
	// Through the outage: requests (limiter calls), the limiter's heartbeat, /readyz pings, the
	// incident flusher: every path that dials Redis.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		send()
		if r, err := http.Get(base + "/readyz"); err == nil {
			r.Body.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd, 15*time.Second, logs); code != 0 {
		t.Fatalf("exit %d\n%s", code, logs.String())
	}

	out := logs.String()
	redisLines, access := 0, 0
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("not a JSON line: %q", line)
			continue
		}
		ts, _ := m["ts"].(string)
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil || !strings.HasSuffix(ts, "Z") {
			t.Errorf("ts is not an ISO-8601 UTC time: %q", line)
		}
		if m["component"] == "go-redis" {
			redisLines++
			if m["level"] != "warn" || m["msg"] != "redis client" || m["message"] == "" {
				t.Errorf("go-redis line not a structured warning: %s", line)
			}
		}
		if m["logger"] == "access" && m["route"] == "/v1/chat/completions" && m["status"] == float64(200) {
			access++
			if !strings.HasPrefix(fmt.Sprint(m["client_addr"]), "127.0.0.1:") || m["method"] != "POST" || m["model"] != "sim" {
				t.Errorf("access line without client_addr, method or model: %s", line)
			}
			if p, _ := m["prompt_tokens"].(float64); p <= 0 {
				t.Errorf("access line without prompt_tokens: %s", line)
			}
			if c, _ := m["completion_tokens"].(float64); c <= 0 {
				t.Errorf("access line without completion_tokens: %s", line)
			}
		}
	}
	if access < 2 {
		t.Errorf("want access lines before and during the outage, got %d:\n%s", access, out)
	}
	if redisLines == 0 {
		t.Errorf("go-redis's failed dials were not logged at all\n%s", out)
	}
	// Kinds of go-redis message are few and each is written at most once per 30 s.
	if redisLines > 10 {
		t.Errorf("%d go-redis lines in a 3 s outage: not rate-limited\n%s", redisLines, out)
	}
	t.Logf("%d go-redis lines in the outage", redisLines)
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
