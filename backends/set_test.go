package backends

import (
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
)

// fakeEngine serves SGLang's shapes (the fixtures) on loopback; oldName serves only the
// deprecated /get_server_info.
func fakeEngine(t *testing.T, oldName bool, up *atomic.Bool) string {
	t.Helper()
	info, _ := os.ReadFile("testdata/server_info.json")
	models, _ := os.ReadFile("testdata/models.json")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if !up.Load() {
			ctx.SetStatusCode(503)
			return
		}
		switch p := string(ctx.Path()); {
		case p == "/server_info" && !oldName, p == "/get_server_info":
			ctx.SetBody(info)
		case p == "/v1/models":
			ctx.SetBody(models)
		case p == "/v1/loads" && !oldName:
			ctx.SetBodyString(`{"loads":[{"dp_rank":0,"num_used_tokens":700},{"dp_rank":1,"num_used_tokens":50}]}`)
		case p == "/metrics" && oldName: // older engines: the gauge only
			ctx.SetBodyString("# TYPE sglang:num_used_tokens gauge\nsglang:num_used_tokens{dp_rank=\"0\",engine_type=\"unified\"} 700.0\nsglang_num_used_tokens{dp_rank=\"1\"} 50\nsglang:num_used_tokens_total 99\n")
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func newTestSet(t *testing.T, cfgs ...config.Backend) *Set {
	s, err := New(cfgs, Options{PollInterval: time.Hour, MaxAge: time.Second, PollTimeout: time.Second}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPollReadsSGLangShapes(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	for _, old := range []bool{false, true} {
		s := newTestSet(t, config.Backend{Name: "u", URL: fakeEngine(t, old, &up), Role: "unified"})
		b := s.Get("u")
		s.PollOnce(b)
		c := b.Capacity()
		if c == nil || b.LastError() != "" {
			t.Fatalf("old=%v: no reading: %s", old, b.LastError())
		}
		if c.PoolTokens != 20480 || c.MaxReqInputLen != 20474 || c.ContextLen != 32768 || c.Mode != "null" ||
			c.BootstrapPort != 8998 || c.UsedTokens != 750 || c.Model != "qwen/qwen2.5-0.5b-instruct" {
			t.Fatalf("old=%v: wrong reading %+v", old, c)
		}
		if !c.PoolBelowContext() || !b.RoleMatches() || !s.Ready() {
			t.Fatalf("old=%v: pool 20480 < ctx 32768, role unified matches \"null\", set is ready", old)
		}
		routes, err := s.Routes(time.Now())
		if err != nil || len(routes) != 1 || routes[0].MaxReqInputLen != 20474 || routes[0].Load() != 750 {
			t.Fatalf("old=%v: routes %+v %v", old, routes, err)
		}
	}
}

func TestRoutesFailClosed(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	url := fakeEngine(t, false, &up)
	s := newTestSet(t, config.Backend{Name: "u", URL: url, Role: "unified"})
	if _, err := s.Routes(time.Now()); !errors.Is(err, ErrCapacityUnknown) {
		t.Fatalf("never read: want capacity_unknown, got %v", err)
	}
	s.PollOnce(s.Get("u"))
	if _, err := s.Routes(time.Now().Add(2 * time.Second)); !errors.Is(err, ErrCapacityUnknown) {
		t.Fatalf("reading older than max age: want capacity_unknown, got %v", err)
	}
	s.SetQuarantine(map[string]time.Time{"u": time.Now().Add(time.Minute)})
	if _, err := s.Routes(time.Now()); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("quarantined: want no_backend, got %v", err)
	}
	s.SetQuarantine(nil)
	if _, err := s.Routes(time.Now()); err != nil {
		t.Fatalf("released: %v", err)
	}
	up.Store(false)
	s.PollOnce(s.Get("u"))
	if _, err := s.Routes(time.Now()); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("engine down: want no_backend, got %v", err)
	}
}

func TestRoleMismatchAndPairs(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	url := fakeEngine(t, false, &up) // reports disaggregation_mode "null"
	s := newTestSet(t, config.Backend{Name: "p", URL: url, Role: "prefill"}, config.Backend{Name: "d", URL: url, Role: "decode"})
	for _, b := range s.All() {
		s.PollOnce(b)
		if b.RoleMatches() {
			t.Fatalf("%s: configured %s, reports null: must not match", b.Name, b.Role)
		}
	}
	if _, err := s.Routes(time.Now()); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("mismatched roles leave no route: %v", err)
	}
}

func TestSumGauge(t *testing.T) {
	text := []byte("# HELP x\nsglang:num_used_tokens{a=\"}\"} 3\nsglang_num_used_tokens 4.0\nsglang:num_used_tokens_max 100\nsglang:other 7\n")
	if n, ok := sumGauge(text, "num_used_tokens"); !ok || n != 7 {
		t.Fatalf("got %d %v, want 7", n, ok)
	}
	if _, ok := sumGauge([]byte("nothing here"), "num_used_tokens"); ok {
		t.Fatal("found a gauge that is not there")
	}
}

func TestSumField(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{`{"loads":[{"num_used_tokens":3},{"num_used_tokens":4}]}`, 7, true},
		{`[{"num_used_tokens":5}]`, 5, true},
		{`{"num_used_tokens":9,"other":1}`, 9, true},
		{`{"x":1}`, 0, false},
		{`not json`, 0, false},
	} {
		got, ok := sumField([]byte(c.in), "num_used_tokens")
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %d %v", c.in, got, c.ok)
		}
	}
}

// Unavailable names why no route can take traffic, by cause, and is empty while one can.
func TestUnavailableNamesTheCause(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	url := fakeEngine(t, false, &up) // reports disaggregation_mode "null"
	s := newTestSet(t, config.Backend{Name: "u", URL: url, Role: "unified"}, config.Backend{Name: "p", URL: url, Role: "prefill"},
		config.Backend{Name: "d", URL: url, Role: "decode"})
	now := time.Now()
	if got := s.Unavailable(now); !strings.Contains(got, "3 without a fresh capacity reading") {
		t.Fatalf("never read: %q", got)
	}
	for _, b := range s.All() {
		s.PollOnce(b)
	}
	now = time.Now()
	if got := s.Unavailable(now); got != "" {
		t.Fatalf("unified usable: %q", got)
	}
	s.SetQuarantine(map[string]time.Time{"u": now.Add(time.Minute)})
	if got := s.Unavailable(now); !strings.Contains(got, "1 quarantined") || !strings.Contains(got, "2 reporting another role") {
		t.Fatalf("unified quarantined, pair with the wrong role: %q", got)
	}
	s.SetQuarantine(nil)
	up.Store(false)
	for _, b := range s.All() {
		s.PollOnce(b)
	}
	if got := s.Unavailable(time.Now()); !strings.Contains(got, "(3 configured: 3 down)") {
		t.Fatalf("all down: %q", got)
	}
}

// A prefill pairs only with the decodes of its model and group; RoutesFor keeps one model.
func TestPairingWithinModelAndGroup(t *testing.T) {
	s := newTestSet(t,
		config.Backend{Name: "a-p", URL: "http://127.0.0.1:1", Role: config.RolePrefill, Model: "a"},
		config.Backend{Name: "a-d", URL: "http://127.0.0.1:2", Role: config.RoleDecode, Model: "a"},
		config.Backend{Name: "b-p1", URL: "http://127.0.0.1:3", Role: config.RolePrefill, Model: "b", Group: "east"},
		config.Backend{Name: "b-d1", URL: "http://127.0.0.1:4", Role: config.RoleDecode, Model: "b", Group: "east"},
		config.Backend{Name: "b-d2", URL: "http://127.0.0.1:5", Role: config.RoleDecode, Model: "b", Group: "west"},
		config.Backend{Name: "b-p2", URL: "http://127.0.0.1:6", Role: config.RolePrefill, Model: "b", Group: "west"},
		config.Backend{Name: "b-u", URL: "http://127.0.0.1:7", Role: config.RoleUnified, Model: "b"},
	)
	now := time.Now()
	for _, b := range s.All() {
		SetCapacityForTest(b, &Capacity{PoolTokens: 1000, MaxReqInputLen: 900, ContextLen: 2000, ReadAt: now})
	}
	names := func(rs []Route) string {
		var out []string
		for _, r := range rs {
			out = append(out, strings.Join(r.Backends, "+"))
		}
		return strings.Join(out, ",")
	}
	all, err := s.Routes(now)
	if err != nil || names(all) != "b-u,a-p+a-d,b-p1+b-d1,b-p2+b-d2" {
		t.Fatalf("every route: %s %v", names(all), err)
	}
	if b, err := s.RoutesFor("b", now); err != nil || names(b) != "b-u,b-p1+b-d1,b-p2+b-d2" {
		t.Fatalf("model b: %s %v", names(b), err)
	}
	if _, err := s.RoutesFor("c", now); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("a model no backend serves: %v", err)
	}
}

// The free-KV estimate: unknown usage fails closed; in use is the larger of the engine's report
// and what the gateway dispatched (a burst the engine has not reported yet still counts, and the
// two are not added twice); Reserve takes prompt on a prefill and prompt+output on a decode, and
// refuses when any leg lacks room.
func TestKVFreeAndReserve(t *testing.T) {
	s := newTestSet(t, config.Backend{Name: "u", URL: "http://127.0.0.1:1", Role: "unified"},
		config.Backend{Name: "p", URL: "http://127.0.0.1:1", Role: "prefill"}, config.Backend{Name: "d", URL: "http://127.0.0.1:1", Role: "decode"})
	u, p, d := s.Get("u"), s.Get("p"), s.Get("d")
	SetCapacityForTest(u, &Capacity{PoolTokens: 1000, UsedTokens: -1, ReadAt: time.Now()})
	if _, known := u.KVFree(); known {
		t.Fatal("usage never reported: the estimate must be unknown")
	}
	uni := Route{Unified: u}
	if uni.Reserve(1, 1) {
		t.Fatal("unknown usage must fail closed")
	}
	SetCapacityForTest(u, &Capacity{PoolTokens: 1000, UsedTokens: 300, ReadAt: time.Now()})
	if free, _ := u.KVFree(); free != 700 {
		t.Fatalf("free %d, want 700", free)
	}
	if !uni.Reserve(400, 200) {
		t.Fatal("600 fits 700 free")
	}
	if free, _ := u.KVFree(); free != 400 {
		t.Fatalf("after reserving 600 over an engine report of 300: free %d, want 400 (max of the two, not the sum)", free)
	}
	if uni.Reserve(300, 101) {
		t.Fatal("401 must not fit 400 free")
	}
	uni.Unreserve(400, 200)
	if free, _ := u.KVFree(); free != 700 || u.Reserved() != 0 {
		t.Fatalf("after release: free %d reserved %d", free, u.Reserved())
	}
	SetCapacityForTest(p, &Capacity{PoolTokens: 1000, UsedTokens: 0, ReadAt: time.Now()})
	SetCapacityForTest(d, &Capacity{PoolTokens: 500, UsedTokens: 100, ReadAt: time.Now()})
	pd := Route{Prefill: p, Decode: d}
	if !pd.Reserve(300, 100) || p.Reserved() != 300 || d.Reserved() != 400 {
		t.Fatalf("PD reserve: prefill %d decode %d, want 300 and 400", p.Reserved(), d.Reserved())
	}
	if pd.Reserve(50, 100) || p.Reserved() != 300 {
		t.Fatal("decode lacks room: nothing may be taken on either leg")
	}
}
