package state_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/state"
)

func incident(i int) state.Incident {
	return state.Incident{
		Time: time.Unix(1700000000+int64(i), 0).UTC(), Kind: state.KindLeak, RequestID: "req-" + strconv.Itoa(i),
		Victim: "alice", Requester: "bob", Backends: []string{"prefill-0", "decode-0"}, Epoch: uint64(i),
		Context: "before [marker] after",
	}
}

func ids(incs []state.Incident) string {
	var s []string
	for _, in := range incs {
		s = append(s, in.RequestID)
	}
	return strings.Join(s, ",")
}

func TestMemoryIncidents(t *testing.T) {
	ctx := context.Background()
	m := state.NewMemoryIncidents(3)
	for i := 1; i <= 5; i++ {
		m.Record(ctx, incident(i))
	}
	got, _ := m.List(ctx, 0)
	if ids(got) != "req-5,req-4,req-3" {
		t.Fatalf("List = %s, want the 3 newest, newest first", ids(got))
	}
	got, _ = m.List(ctx, 2)
	if ids(got) != "req-5,req-4" {
		t.Fatalf("List(2) = %s", ids(got))
	}
}

func TestRedisIncidentsRoundTrip(t *testing.T) {
	c, prefix := testRedis(t)
	ctx := context.Background()
	r := state.NewRedisIncidents(c, prefix, 100, 10)
	for i := 1; i <= 4; i++ {
		if err := r.Record(ctx, incident(i)); err != nil {
			t.Fatal(err)
		}
	}
	if r.Degraded() || r.QueueLen() != 0 {
		t.Fatalf("healthy Redis: degraded=%v queue=%d", r.Degraded(), r.QueueLen())
	}
	// A second replica (another client) reads the same stream.
	other := state.NewRedisIncidents(secondClient(t), prefix, 100, 10)
	got, err := other.List(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) != "req-4,req-3,req-2" {
		t.Fatalf("List(3) from a second client = %s", ids(got))
	}
	want := incident(4)
	if g := got[0]; !g.Time.Equal(want.Time) || g.Victim != want.Victim || g.Requester != want.Requester ||
		g.Epoch != want.Epoch || g.Context != want.Context || strings.Join(g.Backends, ",") != "prefill-0,decode-0" {
		t.Fatalf("round trip changed the incident: %+v", g)
	}
	if n := c.XLen(ctx, r.Key()).Val(); n != 4 {
		t.Fatalf("stream %s has %d entries, want 4", r.Key(), n)
	}
}

func secondClient(t *testing.T) redis.UniversalClient {
	url := os.Getenv("KVGATE_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:6379/15"
	}
	c, err := state.NewClient(url, "standalone")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ownRedis runs a private redis-server on a loopback port; data survives a restart only through
// an explicit SAVE into dir.
type ownRedis struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (o *ownRedis) start() {
	o.t.Helper()
	o.cmd = exec.Command("/usr/bin/redis-server", "--port", strconv.Itoa(o.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", o.dir, "--dbfilename", "dump.rdb")
	if err := o.cmd.Start(); err != nil {
		o.t.Fatalf("starting redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: o.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			o.t.Fatalf("redis-server on %s did not answer: %v", o.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (o *ownRedis) kill() {
	if o.cmd != nil && o.cmd.Process != nil {
		o.cmd.Process.Kill()
		o.cmd.Wait()
		o.cmd = nil
	}
}

func (o *ownRedis) addr() string { return "127.0.0.1:" + strconv.Itoa(o.port) }

func TestRedisIncidentsSurviveOutage(t *testing.T) {
	if _, err := os.Stat("/usr/bin/redis-server"); err != nil {
		t.Fatalf("this test needs /usr/bin/redis-server: %v", err)
	}
	o := &ownRedis{t: t, port: freePort(t), dir: t.TempDir()}
	o.start()
	t.Cleanup(o.kill)

	// Short timeouts and no retries, so calls fail fast while the server is gone.
	c := redis.NewClient(&redis.Options{Addr: o.addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	r := state.NewRedisIncidents(c, "outage:", 1000, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()

	for i := 1; i <= 3; i++ {
		if err := r.Record(ctx, incident(i)); err != nil {
			t.Fatal(err)
		}
	}
	if r.Degraded() || r.QueueLen() != 0 {
		t.Fatalf("before the outage: degraded=%v queue=%d", r.Degraded(), r.QueueLen())
	}
	// Persist what is there, then kill the server abruptly.
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	o.kill()

	start := time.Now()
	for i := 4; i <= 6; i++ {
		if err := r.Record(ctx, incident(i)); err != nil {
			t.Fatalf("Record during the outage returned %v, want nil (queued)", err)
		}
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("3 Records during the outage took %v", took)
	}
	if !r.Degraded() || r.QueueLen() != 3 {
		t.Fatalf("during the outage: degraded=%v queue=%d, want true, 3", r.Degraded(), r.QueueLen())
	}
	got, err := r.List(ctx, 0)
	if err == nil || ids(got) != "req-6,req-5,req-4" {
		t.Fatalf("List during the outage = %s, %v; want the queued ones and an error", ids(got), err)
	}

	o.start()
	deadline := time.Now().Add(15 * time.Second)
	for r.QueueLen() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("queue not flushed 15 s after Redis came back (len %d)", r.QueueLen())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.Degraded() {
		t.Error("still degraded after the flush")
	}
	msgs, err := c.XRange(ctx, r.Key(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var inStream []string
	for _, m := range msgs {
		s, _ := m.Values["incident"].(string)
		inStream = append(inStream, s[strings.Index(s, `"request_id":"`)+14:][:5])
	}
	if strings.Join(inStream, ",") != "req-1,req-2,req-3,req-4,req-5,req-6" {
		t.Fatalf("stream after recovery: %v, want req-1..req-6 in order", inStream)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop after its context was cancelled")
	}
}

func TestRedisIncidentsQueueBound(t *testing.T) {
	// A client pointed at a closed port: every call fails at once.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(freePort(t)),
		DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	r := state.NewRedisIncidents(c, "bound:", 10, 2)
	for i := 1; i <= 5; i++ {
		if err := r.Record(context.Background(), incident(i)); err != nil {
			t.Fatal(err)
		}
	}
	if r.QueueLen() != 2 || r.Dropped() != 3 || !r.Degraded() {
		t.Fatalf("queue=%d dropped=%d degraded=%v, want 2, 3, true", r.QueueLen(), r.Dropped(), r.Degraded())
	}
}

func testQuarantine(t *testing.T, q, replica state.Quarantine) {
	ctx := context.Background()
	if err := q.Quarantine(ctx, "decode-0", "leak req-1", 0); err == nil {
		t.Error("zero ttl accepted")
	}
	if err := q.Quarantine(ctx, "decode-0", "leak req-1", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := q.Quarantine(ctx, "prefill-0", "leak req-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := q.Quarantine(ctx, "unified-1", "leak req-2", time.Hour); err != nil {
		t.Fatal(err)
	}
	act, err := replica.Active(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(act) != 3 {
		t.Fatalf("Active from the replica = %v, want 3 backends", act)
	}
	if u := act["prefill-0"]; time.Until(u) < 59*time.Minute || time.Until(u) > time.Hour+time.Second {
		t.Errorf("prefill-0 until %v, want about an hour from now", u)
	}
	// The replica releases one; the other sees it gone.
	if err := replica.Release(ctx, "unified-1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // decode-0's flag expires meanwhile
	act, err = q.Active(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := act["prefill-0"]; len(act) != 1 || !ok {
		t.Fatalf("Active after release and expiry = %v, want only prefill-0", act)
	}
}

func TestMemoryQuarantine(t *testing.T) {
	q := state.NewMemoryQuarantine()
	testQuarantine(t, q, q)
}

func TestRedisQuarantine(t *testing.T) {
	c, prefix := testRedis(t)
	q := state.NewRedisQuarantine(c, prefix)
	testQuarantine(t, q, state.NewRedisQuarantine(secondClient(t), prefix))
	// Expired names are pruned from the set.
	if n := c.SCard(context.Background(), state.Keys{Prefix: prefix}.Quarantined()).Val(); n != 1 {
		t.Errorf("quarantine set holds %d names after pruning, want 1", n)
	}
}

func TestRedisIncidentsIgnoreCallerCancellation(t *testing.T) {
	c, prefix := testRedis(t)
	r := state.NewRedisIncidents(c, prefix, 100, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the request that found the leak is already gone
	if err := r.Record(ctx, incident(1)); err != nil {
		t.Fatal(err)
	}
	if r.Degraded() || r.QueueLen() != 0 || c.XLen(context.Background(), r.Key()).Val() != 1 {
		t.Fatalf("degraded=%v queue=%d: the incident should be in the stream", r.Degraded(), r.QueueLen())
	}
}

// TestRedisFailClosed: models' fail-closed flags (count drift) behave as quarantine flags, under
// keys of their own: a model flagged on one replica is flagged on another until cleared, and a
// backend's quarantine flag of the same name is another flag.
func TestRedisFailClosed(t *testing.T) {
	c, prefix := testRedis(t)
	f := state.NewRedisFailClosed(c, prefix)
	testQuarantine(t, f, state.NewRedisFailClosed(secondClient(t), prefix))
	ctx := context.Background()
	q := state.NewRedisQuarantine(c, prefix)
	if err := f.Quarantine(ctx, "qwen", "count drift", time.Hour); err != nil {
		t.Fatal(err)
	}
	if active, _ := q.Active(ctx); len(active) != 0 {
		t.Fatalf("a fail-closed model shows as a quarantined backend: %v", active)
	}
	if c.Exists(ctx, state.Keys{Prefix: prefix}.FailClosedFlag("qwen")).Val() != 1 {
		t.Fatal("the fail-closed flag is not under its key")
	}
	other := state.NewRedisFailClosed(secondClient(t), prefix)
	if active, _ := other.Active(ctx); active["qwen"].IsZero() {
		t.Fatalf("another replica does not see the fail-closed model: %v", active)
	}
	if err := other.Release(ctx, "qwen"); err != nil {
		t.Fatal(err)
	}
	if active, _ := f.Active(ctx); !active["qwen"].IsZero() {
		t.Fatalf("cleared on one replica, still fail-closed on another: %v", active)
	}
}
