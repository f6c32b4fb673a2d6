package procs

import (
	"bufio"
	"bytes"
	"encoding/json"
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

	"github.com/kvgate/kvgate/lab/enginesim"
)

// simStartTimeout bounds how long StartSim waits for a fresh process to
// print its address and answer /health.
const simStartTimeout = 10 * time.Second

// Sim is one running `kvgate-lab sim` process.
type Sim struct {
	URL           string // "http://127.0.0.1:PORT"
	Addr          string // "127.0.0.1:PORT"
	BootstrapPort int    // prefill mode: the bootstrap port actually bound (from /server_info); else 0
	Args          []string

	apiKey string
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has exited
	log    *procLog
	mu     sync.Mutex
}

// SimStats is the body of GET /sim/stats, as the simulator defines it.
type SimStats = enginesim.SimStats

// FreePort asks the kernel for a free loopback TCP port. The port is free
// when FreePort returns; another process may still take it before use.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartSim runs `kvgate-lab sim --listen 127.0.0.1:0 <args...>` as a real
// process, waits until GET /health answers 200, stops it when the test ends
// and, if the test failed, writes its output to the test log. An explicit
// --listen in args wins over the default (the last flag counts).
func StartSim(t testing.TB, args ...string) *Sim {
	t.Helper()
	s := &Sim{}
	s.start(t, "127.0.0.1:0", args)
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("kvgate-lab sim %s output:\n%s", strings.Join(s.Args, " "), s.log.String())
		}
	})
	return s
}

func (s *Sim) start(t testing.TB, listen string, args []string) {
	t.Helper()
	s.Args = append([]string(nil), args...)
	s.apiKey = flagValue(args, "api-key")
	full := append([]string{"sim", "--listen", listen}, args...)
	cmd := exec.Command(LabBinary(t), full...)
	// If the test process dies without cleanup, the simulator dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	log := newProcLog()
	// Stdout is parsed for the "listening on ADDR" line; both streams are kept
	// for the failure dump.
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatalf("testkit: starting kvgate-lab sim: %v", err)
	}
	done := make(chan struct{})
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			if a, ok := strings.CutPrefix(line, "listening on "); ok {
				select {
				case addrCh <- strings.TrimSpace(a):
				default:
				}
			}
		}
		// Drain whatever is left so the child never blocks on a full pipe.
		_, _ = io.Copy(log, stdout)
	}()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.log = cmd, done, log
	s.mu.Unlock()

	deadline := time.Now().Add(simStartTimeout)
	select {
	case a := <-addrCh:
		s.Addr = a
	case <-done:
		t.Fatalf("testkit: kvgate-lab sim exited before listening:\n%s", log.String())
	case <-time.After(time.Until(deadline)):
		s.Stop()
		t.Fatalf("testkit: kvgate-lab sim printed no address in %v:\n%s", simStartTimeout, log.String())
	}
	s.URL = "http://" + s.Addr
	client := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequest("GET", s.URL+"/health", nil)
		s.auth(req)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-done:
			t.Fatalf("testkit: kvgate-lab sim exited during start-up:\n%s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			t.Fatalf("testkit: kvgate-lab sim not healthy in %v (last error %v):\n%s", simStartTimeout, err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.BootstrapPort = 0
	var info struct {
		Mode string `json:"disaggregation_mode"`
		Port int    `json:"disaggregation_bootstrap_port"`
	}
	if err := s.getJSON("/server_info", &info); err != nil {
		t.Fatalf("testkit: reading /server_info: %v\n%s", err, log.String())
	}
	if info.Mode == "prefill" {
		s.BootstrapPort = info.Port
	}
}

// Stop kills the process and waits for it to exit. It is idempotent.
func (s *Sim) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart stops the process and starts a new one on the same port with new
// args (the old args are not reused).
func (s *Sim) Restart(t testing.TB, args ...string) {
	t.Helper()
	s.Stop()
	addr := s.Addr
	// The kernel may need a moment to let the port go; retry briefly.
	var lastErr error
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			l.Close()
			lastErr = nil
			break
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	if lastErr != nil {
		t.Fatalf("testkit: port %s still busy after stop: %v", addr, lastErr)
	}
	s.start(t, addr, args)
}

// Stats returns GET /sim/stats decoded; a failure fails the test.
func (s *Sim) Stats(t testing.TB) SimStats {
	t.Helper()
	var st SimStats
	if err := s.getJSON("/sim/stats", &st); err != nil {
		t.Fatalf("testkit: /sim/stats: %v", err)
	}
	return st
}

// Output returns what the process has written to stdout and stderr so far.
func (s *Sim) Output() string { return s.log.String() }

func (s *Sim) auth(req *http.Request) {
	if s.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.apiKey)
	}
}

func (s *Sim) getJSON(path string, v any) error {
	req, err := http.NewRequest("GET", s.URL+path, nil)
	if err != nil {
		return err
	}
	s.auth(req)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return json.Unmarshal(body, v)
}

// flagValue finds --name V, -name V, --name=V or -name=V in args (the last
// one wins, as with the flag package).
func flagValue(args []string, name string) string {
	v := ""
	for i := 0; i < len(args); i++ {
		a := strings.TrimLeft(args[i], "-")
		if len(a) == len(args[i]) {
			continue
		}
		if a == name && i+1 < len(args) {
			v = args[i+1]
			i++
		} else if rest, ok := strings.CutPrefix(a, name+"="); ok {
			v = rest
		}
	}
	return v
}

// procLog is a concurrency-safe buffer for a child's output.
type procLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func newProcLog() *procLog { return &procLog{} }

func (l *procLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Keep the last 1 MiB so a chatty process cannot grow the test's memory.
	if l.buf.Len() > 1<<20 {
		b := l.buf.Bytes()
		keep := append([]byte(nil), b[len(b)-(1<<19):]...)
		l.buf.Reset()
		l.buf.WriteString("...[truncated]...\n")
		l.buf.Write(keep)
	}
	return l.buf.Write(p)
}

func (l *procLog) String() string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
