package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// server.metrics_listen: /metrics (tenant-labelled series included) is served on its own
// address only; the listener clients reach answers 404 for it.
func TestMetricsOnTheirOwnListener(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	port, mport := procs.FreePort(t), procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: tenant-with-a-secret-name, key_sha256: %q, tpm: 100000}]
capacity: {poll_interval: 200ms}
server: {metrics_listen: "127.0.0.1:%d", metrics_key_sha256: %q}
`, port, sim.URL, config.SHA256Hex("t-key"), mport, config.SHA256Hex("scrape-key")))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	req, _ := http.NewRequest("POST", base+"/generate", strings.NewReader(`{"text":"hello","sampling_params":{"max_new_tokens":2}}`))
	req.Header.Set("Authorization", "Bearer t-key")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}
	read := func(url string) (int, string) {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer scrape-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := read(base + "/metrics"); code != 404 || strings.Contains(body, "tenant-with-a-secret-name") {
		t.Fatalf("main listener /metrics: %d %.300s", code, body)
	}
	code, body := read(fmt.Sprintf("http://127.0.0.1:%d/metrics", mport))
	if code != 200 || !strings.Contains(body, `tenant="tenant-with-a-secret-name"`) {
		t.Fatalf("metrics listener: %d, tenant series missing:\n%.500s", code, body)
	}
	if code, _ := read(fmt.Sprintf("http://127.0.0.1:%d/v1/models", mport)); code != 404 {
		t.Fatalf("metrics listener serves other routes: %d", code)
	}
}
