package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// readyBody is /readyz's answer.
type readyBody struct {
	Status   string `json:"status"`
	Reason   string `json:"reason"`
	Degraded bool   `json:"degraded"`
}

// waitReady polls /readyz until want(status, body) holds, failing after 5 s with the last answer.
func waitReady(t *testing.T, url string, want func(int, readyBody) bool) readyBody {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := get(t, url+"/readyz", "")
		var b readyBody
		if err := json.Unmarshal(r.body, &b); err != nil {
			t.Fatalf("readyz is not JSON: %d %s", r.status, r.body)
		}
		if want(r.status, b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz: last answer %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The only engine goes down: /readyz turns 503 naming the cause (it answered 200 while every
// request got 503 no_backend), and 200 again once the engine is back.
func TestReadyOnlyBackendDown(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 && b.Status == "ready" })
	sim.Stop()
	b := waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 503 })
	if b.Status != "unavailable" || !strings.Contains(b.Reason, "1 down") {
		t.Fatalf("want unavailable naming 1 down, got %+v", b)
	}
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi","sampling_params":{"max_new_tokens":2}}`); r.status != 503 {
		t.Fatalf("a request while readyz says unavailable: %d %s", r.status, r.body)
	}
	sim.Restart(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 && b.Status == "ready" })
}

// Every backend quarantined through the admin API: /readyz 503 naming the quarantine; releasing
// one makes it ready again.
func TestReadyAllQuarantined(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("",
		[3]string{"one", sim.URL, "unified"}, [3]string{"two", sim.URL, "unified"})))
	waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 })
	if r := post(t, gw.URL, "/admin/backends/one/quarantine", "", ""); r.status != 401 {
		t.Fatalf("quarantine without the admin key: %d", r.status)
	}
	for _, name := range []string{"one", "two"} {
		if r := post(t, gw.URL, "/admin/backends/"+name+"/quarantine?ttl=10m", "admin-key", ""); r.status != 200 || !strings.Contains(string(r.body), `"quarantined":"`+name+`"`) {
			t.Fatalf("quarantine %s: %d %s", name, r.status, r.body)
		}
		if name == "one" {
			// One of two out: still ready.
			waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 })
		}
	}
	// Applied on this replica at once, so the first probe already sees it.
	r := get(t, gw.URL+"/readyz", "")
	var b readyBody
	_ = json.Unmarshal(r.body, &b)
	if r.status != 503 || b.Status != "unavailable" || !strings.Contains(b.Reason, "2 quarantined") {
		t.Fatalf("every backend quarantined: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi","sampling_params":{"max_new_tokens":2}}`); r.status != 503 || !strings.Contains(string(r.body), "no_backend") {
		t.Fatalf("a request with every backend quarantined: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/admin/backends/two/quarantine?ttl=soon", "admin-key", ""); r.status != 400 {
		t.Fatalf("a bad ttl: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/admin/backends/nope/quarantine", "admin-key", ""); r.status != 404 {
		t.Fatalf("an unknown backend: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/admin/backends/two/release", "admin-key", ""); r.status != 200 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 && b.Status == "ready" })
}

// Redis stops: the very next probe reports it (degraded, still 200: serving goes on from local
// state), before any request or limiter call has touched Redis; Redis back, ready again.
func TestReadyRedisUnreachable(t *testing.T) {
	port := procs.FreePort(t)
	stop := startRedis(t, port)
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML(
		fmt.Sprintf("state: {redis_url: \"redis://127.0.0.1:%d/0\", key_prefix: \"ready-%d:\"}\n", port, time.Now().UnixNano()),
		[3]string{"sim", sim.URL, "unified"})))
	waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 && b.Status == "ready" && !b.Degraded })
	stop()
	start := time.Now()
	r := get(t, gw.URL+"/readyz", "")
	var b readyBody
	_ = json.Unmarshal(r.body, &b)
	if r.status != 200 || !b.Degraded || !strings.Contains(b.Reason, "Redis") || !strings.Contains(b.Reason, "ping") {
		t.Fatalf("the first probe after Redis stopped: %d %s", r.status, r.body)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the probe took %s with Redis down", d)
	}
	startRedis(t, port)
	waitReady(t, gw.URL, func(s int, b readyBody) bool { return s == 200 && !b.Degraded })
}
