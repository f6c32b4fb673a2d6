package gateway_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// startRedis runs a private redis-server on port (nothing on disk) until stopped.
func startRedis(t *testing.T, port int) func() {
	t.Helper()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server: %v (install Debian's redis-server)", err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("private redis-server did not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return stop
}

// With Redis gone the gateway keeps serving and scanning, says so in /readyz and metrics, and
// queues incidents; once Redis is back they are all in the stream.
func TestRedisOutageQueuesIncidents(t *testing.T) {
	port := procs.FreePort(t)
	stop := startRedis(t, port)
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "16384")
	yaml := strings.Replace(canaryYAML("outage:", "enforce", [3]string{"sim", sim.URL, "unified"}),
		fmt.Sprintf("redis_url: %q", testRedisURL()), fmt.Sprintf("redis_url: \"redis://127.0.0.1:%d/0\"", port), 1)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	stop()

	aMarker := markerFor(t, "test-secret-of-at-least-32-bytes", "a")
	body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":48}`, strings.Repeat(aMarker+" ", 100))
	for i := 0; i < 3; i++ {
		if r := post(t, gw.URL, "/v1/chat/completions", "sk-b", body); r.status != 200 || strings.Contains(string(r.body), "KVG-") {
			t.Fatalf("serving must go on while Redis is down: %d %s", r.status, r.body)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := get(t, gw.URL+"/readyz", "")
		if r.status == 200 && strings.Contains(string(r.body), `"degraded":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz should report degraded: %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if m := get(t, gw.URL+"/metrics", "admin-key"); !strings.Contains(string(m.body), "kvgate_state_degraded 1") {
		t.Fatalf("metric kvgate_state_degraded should be 1")
	}

	startRedis(t, port)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer c.Close()
	deadline = time.Now().Add(10 * time.Second)
	for {
		n, _ := c.XLen(context.Background(), "outage:{kvgate}:incidents").Result()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queued incidents not flushed after Redis came back: %d in the stream", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	entries, err := c.XRange(context.Background(), "outage:{kvgate}:incidents", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if s, _ := e.Values["incident"].(string); !strings.Contains(s, `"kind":"echo"`) || !strings.Contains(s, `"victim":"a"`) {
			t.Fatalf("unexpected incident %v", e.Values)
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for strings.Contains(string(get(t, gw.URL+"/readyz", "").body), "degraded") {
		if time.Now().After(deadline) {
			t.Fatal("readyz still degraded after Redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
