package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/testkit"
)

// syncBuf is a log buffer the process writes while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// SIGTERM while streams are open: `kvgate serve` stops accepting new connections at once, lets
// every stream in flight run to its [DONE], and then exits 0.
func TestFaultSIGTERMDrainsStreams(t *testing.T) {
	sim := testkit.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "50ms")
	port := testkit.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
`, port, sim.URL, config.SHA256Hex("sk-drain")))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	const streams, tokens = 4, 40 // 40 tokens at 50 ms: 2 s per stream
	type result struct {
		body []byte
		err  error
	}
	started := make(chan struct{}, streams)
	results := make(chan result, streams)
	for i := 0; i < streams; i++ {
		go func(i int) {
			body := fmt.Sprintf(`{"text":"stream %d keeps going","sampling_params":{"max_new_tokens":%d},"stream":true}`, i, tokens)
			req, _ := http.NewRequest("POST", base+"/generate", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer sk-drain")
			resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				started <- struct{}{}
				results <- result{err: err}
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			first, err := br.ReadBytes('\n')
			started <- struct{}{}
			if err != nil {
				results <- result{err: err}
				return
			}
			rest, err := io.ReadAll(br)
			results <- result{body: append(first, rest...), err: err}
		}(i)
	}
	for i := 0; i < streams; i++ {
		<-started
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	signalled := time.Now()
	// New connections are refused soon after the signal (the listener is closed).
	refused := false
	for time.Since(signalled) < 1500*time.Millisecond {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err != nil {
			refused = true
			break
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	if !refused {
		t.Errorf("the gateway still accepted connections 1.5 s into its drain")
	}
	for i := 0; i < streams; i++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("a stream in flight failed during the drain: %v\n%s", r.err, logs.String())
		}
		if !bytes.HasSuffix(r.body, []byte("data: [DONE]\n\n")) || bytes.Contains(r.body, []byte(`"error"`)) {
			t.Fatalf("a stream in flight did not finish cleanly: %.300q", r.body)
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve did not exit 0 after draining: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not exit after its streams finished")
	}
	t.Logf("drained %d streams and exited %s after SIGTERM", streams, time.Since(signalled).Round(time.Millisecond))
}
