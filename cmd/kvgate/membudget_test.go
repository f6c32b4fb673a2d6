package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/tests/procs"
)

// procKiB reads a field (VmRSS, VmHWM) of /proc/<pid>/status in KiB.
func procKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// bigEngine is an engine on loopback whose chat replies are 60 MB of JSON when the prompt says
// "big" (one content string of ordinary words, so the scanners read all of it), small
// otherwise.
func bigEngine(t *testing.T, size int) string {
	t.Helper()
	words := "the quick brown fox jumps over the lazy dog abcdefghij "
	content := strings.Repeat(words, size/len(words))
	big := []byte(`{"id":"c","object":"chat.completion","model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		content + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`)
	small := []byte(`{"id":"c","object":"chat.completion","model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/server_info":
			_, _ = w.Write([]byte(`{"max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":16,"disaggregation_mode":"null"}`))
		case "/v1/models":
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`))
		case "/abort_request":
			_, _ = w.Write([]byte(`{}`))
		case "/v1/chat/completions":
			if strings.Contains(string(body), "big") {
				_, _ = w.Write(big)
				return
			}
			_, _ = w.Write(small)
		default:
			w.WriteHeader(404)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// Issue 15: one 60 MB JSON reply cost the gateway 200–280 MB of RSS, four at once 0.95–1.3 GB,
// never given back. Four concurrent 60 MB replies through `kvgate serve` must keep its RSS
// growth (VmHWM, the peak, against VmRSS before) within upstream.max_buffered_bytes plus the
// process's fixed overhead; replies that do not fit get 503 with Retry-After in OpenAI's
// envelope; small requests are answered 200 meanwhile; the memory is given back after.
//
// GOGC is left at its default: the budget does not depend on it, because a large reply's bytes
// stay charged until a forced collection (debug.FreeOSMemory) has run after it.
func TestBufferedRepliesStayWithinTheMemoryBudget(t *testing.T) {
	const replySize = 60 << 20
	const budget = 256 << 20
	url := bigEngine(t, replySize)
	port := procs.FreePort(t)
	cfg := writeConfig(t, fmt.Sprintf(`listen: "127.0.0.1:%d"
backends: [{name: eng, url: %q, role: unified}]
tenants: [{name: alice, key_sha256: %q}, {name: bob, key_sha256: %q}]
canary: {enabled: true, secret: budget-test-secret-padded-to-32-bytes}
capacity: {poll_interval: 1s}
upstream: {max_buffered_bytes: %d, max_reply_bytes: %d}
`, port, url, config.SHA256Hex("alice-key"), config.SHA256Hex("bob-key"), budget, 64<<20))
	logs := &syncBuf{}
	cmd, base := startServe(t, cfg, port, logs)
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid

	client := &http.Client{Timeout: 50 * time.Second}
	ask := func(key, prompt string) (int, http.Header, []byte, error) {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"`+prompt+`"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b, err
	}
	for i := 0; i < 3; i++ { // warm: connections, pools, the tokenizer
		if code, _, b, err := ask("bob-key", "hello"); err != nil || code != 200 {
			t.Fatalf("warm-up: %d %v %s", code, err, b)
		}
	}
	rssBefore := procKiB(t, pid, "VmRSS")

	var bigDone atomic.Bool
	var smallOK, smallBad, smallMax atomic.Int64
	var smallErr atomic.Value
	smallStop := make(chan struct{})
	go func() {
		defer close(smallStop)
		for !bigDone.Load() {
			t0 := time.Now()
			code, _, b, err := ask("bob-key", "hello")
			if d := int64(time.Since(t0)); d > smallMax.Load() {
				smallMax.Store(d)
			}
			time.Sleep(20 * time.Millisecond) // a steady trickle, not a second load
			if err != nil || code != 200 {
				smallBad.Add(1)
				smallErr.Store(fmt.Sprintf("%d %v %.200s", code, err, b))
				continue
			}
			smallOK.Add(1)
		}
	}()

	type result struct {
		code int
		h    http.Header
		n    int
		body []byte
		err  error
	}
	results := make([]result, 4)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			code, h, b, err := ask("alice-key", "big")
			r := result{code: code, h: h, n: len(b), err: err}
			if len(b) < 4096 {
				r.body = b
			} else if ends := string(b[:300]) + string(b[len(b)-300:]); !strings.Contains(ends, `"usage"`) || !strings.Contains(ends, `"finish_reason":"stop"`) {
				// (whole: its first and last members are there, in the engine's order when its
				// bytes were passed on, else in the canonical one)
				r.body = b[:200]
				r.code = -code // a truncated or malformed reply
			}
			results[i] = r
		}(i)
	}
	wg.Wait()
	bigDone.Store(true)
	<-smallStop
	elapsed := time.Since(start)
	hwm := procKiB(t, pid, "VmHWM")

	served, refused := 0, 0
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Fatalf("big reply %d: %v", i, r.err)
		case r.code == 200 && r.n >= replySize:
			served++
		case r.code == 503:
			var e struct {
				Error struct{ Type, Code, Message string }
			}
			if json.Unmarshal(r.body, &e) != nil || e.Error.Code != "reply_over_budget" || e.Error.Type != "server_error" || r.h.Get("Retry-After") == "" {
				t.Fatalf("big reply %d refused without the envelope or Retry-After: %v %s", i, r.h, r.body)
			}
			refused++
		default:
			t.Fatalf("big reply %d: %d (%d bytes) %s", i, r.code, r.n, r.body)
		}
	}
	growth := (hwm - rssBefore) << 10
	t.Logf("4 × %d MiB replies in %s: %d served, %d refused (503); RSS before %d MiB, peak (VmHWM) %d MiB, growth %d MiB against a budget of %d MiB; small requests: %d answered 200, %d not, slowest %s",
		replySize>>20, elapsed.Round(time.Millisecond), served, refused, rssBefore>>10, hwm>>10, growth>>20, budget>>20, smallOK.Load(), smallBad.Load(), time.Duration(smallMax.Load()).Round(time.Millisecond))
	if served == 0 {
		t.Fatal("no big reply was served: the budget holds none of them")
	}
	if smallBad.Load() > 0 || smallOK.Load() == 0 {
		t.Fatalf("small requests during the big replies: %d answered, %d failed (last: %v)", smallOK.Load(), smallBad.Load(), smallErr.Load())
	}
	// The budget bounds what replies hold; the rest of the process (runtime, buffers of the
	// connections, the response being written) gets a fixed allowance.
	if overhead := int64(48 << 20); growth > budget+overhead {
		t.Fatalf("RSS grew by %d MiB: more than the budget (%d MiB) plus %d MiB", growth>>20, budget>>20, overhead>>20)
	}
	// And the memory is given back to the OS once the replies are done.
	var rssAfter int64
	for deadline := time.Now().Add(15 * time.Second); ; {
		rssAfter = procKiB(t, pid, "VmRSS")
		if rssAfter-rssBefore < 64<<10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("RSS after: %d MiB", rssAfter>>10)
	if rssAfter-rssBefore >= 64<<10 {
		t.Fatalf("RSS %d MiB after the replies, %d MiB before: not given back", rssAfter>>10, rssBefore>>10)
	}
	if code, _, b, err := ask("alice-key", "hello"); err != nil || code != 200 {
		t.Fatalf("after: %d %v %s", code, err, b)
	}
}
