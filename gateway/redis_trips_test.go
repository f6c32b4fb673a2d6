package gateway

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/markerhour"
	"github.com/kvgate/kvgate/tests/redistest"
)

// tripCounter counts Redis round trips by what they carried: each command sent alone or
// pipeline is one, named by its commands (a new connection's handshake is not counted).
type tripCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *tripCounter) add(cmds []redis.Cmder) {
	names := make([]string, 0, len(cmds))
	for _, cmd := range cmds {
		n := cmd.Name()
		if n == "hello" || n == "client" {
			return
		}
		if len(names) == 0 || names[len(names)-1] != n {
			names = append(names, n)
		}
	}
	c.mu.Lock()
	c.n[strings.Join(names, "+")]++
	c.mu.Unlock()
}

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add([]redis.Cmder{cmd}); return next(ctx, cmd) }
}
func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.add(cmds); return next(ctx, cmds) }
}

func (c *tripCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// Issue 23: with Redis state, an admitted request of a tenant with limits costs one round trip
// on its way (the admission, carrying earlier requests' settlements); its fingerprint record is
// queued for the publisher, whose round trip (shared by the records queued meanwhile, reading the
// stream back) overlaps the engine's work, and its reply reads nothing of its own. Counted over
// sequential small chat requests through an in-process gateway (one record per publish here);
// the background work (settlement flushes) is reported too.
func TestRedisRoundTripsPerRequest(t *testing.T) {
	sim, err := enginesim.New(enginesim.Config{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: sim.Handler(), CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	addr := ln.Addr().String()
	prefix := "kvgate-test-trips-" + newID() + ":"
	cfg, err := config.Parse([]byte(`
backends: [{name: sim, url: "http://`+addr+`", role: unified}]
tenants: [{name: alice, key_sha256: "`+config.SHA256Hex("k")+`", rpm: 1000000000, tpm: 1000000000}]
canary: {enabled: true, secret: "inmem test secret, padded to 32 bytes"}
capacity: {poll_interval: 1h}
state: {redis_url: "`+redistest.URL()+`", key_prefix: "`+prefix+`"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	trips := &tripCounter{n: map[string]int{}}
	g, set := redisGateway(t, cfg, trips)
	g.count.WithoutExact()
	backends.SetCapacityForTest(set.Get("sim"), &backends.Capacity{PoolTokens: 65536, MaxReqInputLen: 32000, ContextLen: 32768, ReadAt: time.Now().Add(time.Hour)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.Run(ctx)
	var rc fasthttp.RequestCtx
	for i := 0; i < 5; i++ { // scripts loaded, connections made
		if code, body := serveOne(t, g, &rc, "/v1/chat/completions", benchChat); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	g.lim.limiter.Flush(context.Background())
	time.Sleep(50 * time.Millisecond)
	trips.take()
	const n = 100
	for i := 0; i < n; i++ {
		if code, body := serveOne(t, g, &rc, "/v1/chat/completions", benchChat); code != 200 {
			t.Fatalf("%d %s", code, body)
		}
	}
	g.lim.limiter.Flush(context.Background())
	time.Sleep(50 * time.Millisecond)
	rest := trips.take()
	onPath := 0
	for k, v := range rest {
		if strings.Contains(k, "evalsha") || k == "xrange" {
			onPath += v // admissions (with settlements carried), settlement flushes, catch-up reads
		}
	}
	t.Logf("%d requests: %d round trips for limits and catch-up reads; all round trips by commands: %v", n, onPath, rest)
	if onPath > n+n/10 {
		t.Fatalf("%d round trips carrying limits or catch-up reads for %d requests, want about one each", onPath, n)
	}
	if pub := rest["xadd+xtrim+pexpire+xrange"]; pub < 1 || pub > n {
		t.Fatalf("%d fingerprint publishes for %d requests, want between 1 and one each", pub, n)
	}
}

// redisGateway is an in-process gateway over cfg's Redis state (hooks see every command); it is
// not running: the caller starts g.Run when it needs the background work.
func redisGateway(t *testing.T, cfg *config.Config, hooks ...redis.Hook) (*Gateway, *backends.Set) {
	t.Helper()
	markerhour.Pin(cfg)
	st, err := state.Open(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, h := range hooks {
		st.AddHook(h)
	}
	set, err := backends.New(cfg.Backends, backends.OptionsFrom(cfg), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, set, st, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return g, set
}
