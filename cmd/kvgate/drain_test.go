package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/tests/procs"
)

// syncBuf is a log buffer the process writes while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// SIGTERM while streams are open (drain_delay 0): `kvgate serve` stops accepting new connections
// at once, lets every stream in flight run to its [DONE], and then exits 0.
func TestFaultSIGTERMDrainsStreams(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "50ms")
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
server: {drain_delay: 0s}
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

// stream is one streamed reply read to its end in the background.
type stream struct {
	id   string // X-Request-Id
	body chan []byte
	end  chan time.Time
}

// openStream posts a streaming request and returns once its first event arrived.
func openStream(t *testing.T, url, key, body string) *stream {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream %s: %d %s", url, resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{id: resp.Header.Get("X-Request-Id"), body: make(chan []byte, 1), end: make(chan time.Time, 1)}
	go func() {
		defer resp.Body.Close()
		rest, _ := io.ReadAll(br)
		s.end <- time.Now()
		s.body <- append(first, rest...)
	}()
	return s
}

// exitCode waits (bounded) for the process and returns its exit status.
func exitCode(t *testing.T, cmd *exec.Cmd, within time.Duration, logs *syncBuf) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(within):
		t.Fatalf("serve did not exit within %s:\n%s", within, logs.String())
		return -1
	}
}

// The two phases of a drain, with real processes. SIGTERM: /readyz answers 503 draining at once
// while a request on a new connection is still served 200 (drain_delay); then new connections are
// refused and streams in flight get drain_timeout; streams longer than that end with a
// shutting_down error event in their route's shape (OpenAI chat, Anthropic messages) and an
// access line each, and the process exits 0 once the drain is over, naming them in its log.
func TestDrainDelayThenTimeoutCutsStreams(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "50ms")
	port := procs.FreePort(t)
	const delay, timeout = 1500 * time.Millisecond, 1 * time.Second
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
server: {drain_delay: %s, drain_timeout: %s}
`, port, sim.URL, config.SHA256Hex("sk-drain"), delay, timeout))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	// 200 tokens at 50 ms: 10 s, far past delay + timeout.
	chat := openStream(t, base+"/v1/chat/completions", "sk-drain",
		`{"model":"sim","messages":[{"role":"user","content":"a long answer"}],"max_tokens":200,"stream":true}`)
	msgs := openStream(t, base+"/v1/messages", "sk-drain",
		`{"model":"sim","max_tokens":200,"messages":[{"role":"user","content":"a long answer"}],"stream":true}`)

	_ = cmd.Process.Signal(syscall.SIGTERM)
	signalled := time.Now()
	for {
		r, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("readyz refused during drain_delay: %v", err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode == 503 && strings.Contains(string(b), `"status":"draining"`) {
			break
		}
		if time.Since(signalled) > 500*time.Millisecond {
			t.Fatalf("readyz still %d %s 500 ms after SIGTERM", r.StatusCode, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A new connection during drain_delay is accepted and served.
	tr := &http.Transport{DisableKeepAlives: true}
	req, _ := http.NewRequest("POST", base+"/generate", strings.NewReader(`{"text":"during the delay","sampling_params":{"max_new_tokens":2}}`))
	req.Header.Set("Authorization", "Bearer sk-drain")
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("a request during drain_delay: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a request during drain_delay: %d", resp.StatusCode)
	}
	if since := time.Since(signalled); since >= delay {
		t.Fatalf("the check of drain_delay came too late (%s after SIGTERM)", since)
	}
	// After the delay the listener closes.
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		if time.Since(signalled) > delay+1500*time.Millisecond {
			t.Fatal("the gateway still accepted connections 1.5 s after drain_delay")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if since := time.Since(signalled); since < delay {
		t.Fatalf("connections refused %s after SIGTERM, before drain_delay (%s)", since, delay)
	}
	for _, c := range []struct {
		s     *stream
		shape string
	}{
		{chat, `data: {"error":{"code":"shutting_down"`},
		{msgs, "event: error\ndata: {\"error\":{\"message\":\"The gateway is shutting down"},
	} {
		var end time.Time
		select {
		case end = <-c.s.end:
		case <-time.After(delay + timeout + 5*time.Second):
			t.Fatalf("a stream did not end after the drain deadline:\n%s", logs.String())
		}
		body := <-c.s.body
		if at := end.Sub(signalled); at < delay+timeout-200*time.Millisecond || at > delay+timeout+gateway.DrainCutGrace {
			t.Errorf("stream %s ended %s after SIGTERM, want about drain_delay + drain_timeout (%s)", c.s.id, at, delay+timeout)
		}
		if !bytes.Contains(body, []byte(c.shape)) {
			t.Fatalf("stream %s did not end with the shutting-down error event in its shape %q:\n%s", c.s.id, c.shape, body)
		}
		if c.s == chat && !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
			t.Fatalf("the chat stream must end with [DONE] after its error event: %q", body[max(0, len(body)-200):])
		}
	}
	if code := exitCode(t, cmd, 10*time.Second, logs); code != 0 {
		t.Fatalf("serve exited %d after a drain that cut streams at its deadline, want 0:\n%s", code, logs.String())
	}
	out := logs.String()
	for _, id := range []string{chat.id, msgs.id} {
		access := false
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, `"logger":"access"`) && strings.Contains(line, id) && strings.Contains(line, `"error":"shutting_down"`) {
				access = true
			}
		}
		if !access {
			t.Errorf("no access line for cut stream %s:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "were cut with shutting_down") || !strings.Contains(out, chat.id) || !strings.Contains(out, msgs.id) {
		t.Fatalf("the exit must be logged naming the cut requests:\n%s", out)
	}
}

// A drain that finishes in time exits 0 (drain_delay and drain_timeout both honoured).
func TestDrainCleanExitZero(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "20ms")
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 200ms}
server: {drain_delay: 300ms, drain_timeout: 10s}
`, port, sim.URL, config.SHA256Hex("sk-drain")))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	s := openStream(t, base+"/v1/chat/completions", "sk-drain",
		`{"model":"sim","messages":[{"role":"user","content":"a short answer"}],"max_tokens":30,"stream":true}`)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd, 15*time.Second, logs); code != 0 {
		t.Fatalf("serve exited %d after a clean drain:\n%s", code, logs.String())
	}
	if body := <-s.body; !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) || bytes.Contains(body, []byte("shutting_down")) {
		t.Fatalf("the stream did not finish cleanly: %q", body)
	}
	if !strings.Contains(logs.String(), "every request finished") {
		t.Fatalf("no clean-stop line:\n%s", logs.String())
	}
}
