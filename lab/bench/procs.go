package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// procs owns every child process of a run: each is started in its own process group (nginx's
// workers go with their master) with a parent-death signal, and stopAll ends them all, on the
// normal path, on errors and on ctrl-C alike.
type procs struct {
	dir  string // logs and configs
	mu   sync.Mutex
	list []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs argv with env added to ours, its output to a log file in ps.dir.
func (ps *procs) start(name string, argv []string, env ...string) (*proc, error) {
	return ps.startSig(name, argv, syscall.SIGKILL, env...)
}

// startGuarded runs argv under a guard (this binary, guard.go) that ends argv's whole process
// group even when the bench dies without cleaning up.
func (ps *procs) startGuarded(name string, argv []string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return ps.startSig(name, append([]string{self}, argv...), syscall.SIGTERM, envRole+"=guard")
}

func (ps *procs) startSig(name string, argv []string, deathSig syscall.Signal, env ...string) (*proc, error) {
	log := filepath.Join(ps.dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// A file, not a pipe: the child writes its logs (kvgate's access log) without our help.
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after a grace period (kvgate drains
// open streams for up to server.drain_timeout; a benchmark does not wait for that, and its
// config sets no drain_delay).
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
	// Workers of a master that is gone (nginx) share its group.
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
}

// stopAll stops every process still running, in parallel.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	list := ps.list
	ps.list = nil
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
}

// stopOne stops p and forgets it.
func (ps *procs) stopOne(p *proc) {
	p.stop()
	ps.mu.Lock()
	for i, q := range ps.list {
		if q == p {
			ps.list = append(ps.list[:i], ps.list[i+1:]...)
			break
		}
	}
	ps.mu.Unlock()
}

// tail is the end of a process's log, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

// freeAddr is a loopback address with a port nobody listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitReady polls GET http://addr+path until it answers 200, p exits, or the timeout passes.
func waitReady(ctx context.Context, p *proc, addr, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %s", p.name, p.tail())
		}
		code, _, err := fasthttp.GetTimeout(nil, "http://"+addr+path, time.Second)
		if err == nil && code == 200 {
			return nil
		}
		last = err
		if err == nil {
			last = errors.New("status " + strconv.Itoa(code))
		}
		time.Sleep(50 * time.Millisecond)
	}
	name := addr
	if p != nil {
		name = p.name
		if t := p.tail(); t != "" {
			last = fmt.Errorf("%v; log: %s", last, t)
		}
	}
	return fmt.Errorf("%s not ready at %s%s after %v: %v", name, addr, path, timeout, last)
}

// vmRSS reads a process's resident set (and its peak) from /proc/PID/status, in bytes.
func vmRSS(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS for pid %d", pid)
	}
	return rss, hwm, nil
}

// hexSHA256 of s, as kvgate's config stores keys.
func hexSHA256(s string) string {
	return fmt.Sprintf("%x", sha256.Sum256([]byte(s)))
}
