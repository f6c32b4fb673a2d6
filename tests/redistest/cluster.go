package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters only, on loopback, started for one test: real
// redis-server processes (nothing saved to disk) joined by redis-cli --cluster create.
type Cluster struct {
	// Addrs are the masters' host:port, in the order their slot ranges were assigned.
	Addrs []string
	// URL is the cluster for state.redis_url with redis_mode cluster.
	URL string
}

// StartCluster starts masters redis-server processes with cluster mode on free loopback ports
// (the cluster bus on a port of its own), creates the cluster with no replicas, waits for
// cluster_state:ok on every node, and kills them all when the test ends.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	dir := t.TempDir()
	c := &Cluster{}
	for i := 0; i < masters; i++ {
		port, bus := freePort(t), freePort(t)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-port", fmt.Sprint(bus),
			"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
			"--dir", dir, "--save", "", "--appendonly", "no")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test binary
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("redis-server: %v (install Debian's redis-server)", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("redis-server %s output:\n%s", addr, out.String())
			}
		})
		waitFor(t, "redis-server "+addr+" answering", func() bool {
			cl := redis.NewClient(&redis.Options{Addr: addr})
			defer cl.Close()
			return cl.Ping(context.Background()).Err() == nil
		})
		c.Addrs = append(c.Addrs, addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, addr := range c.Addrs {
		waitFor(t, "cluster_state:ok on "+addr, func() bool {
			cl := redis.NewClient(&redis.Options{Addr: addr})
			defer cl.Close()
			info, err := cl.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
	more := make([]string, 0, len(c.Addrs)-1)
	for _, a := range c.Addrs[1:] {
		more = append(more, "addr="+a)
	}
	c.URL = "redis://" + c.Addrs[0] + "?" + strings.Join(more, "&")
	return c
}

// Node is a plain client of one master, for asking it what it holds.
func (c *Cluster) Node(i int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: c.Addrs[i]})
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: not within 15s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
