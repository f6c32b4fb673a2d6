package gateway

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/enginesim"
)

// inmemGateway is a gateway (tenant "alice", key "k", canaries on) whose one unified backend is
// a fast-mode simulator on an in-memory listener: the whole request path runs, network included
// as fasthttp sees it, without sockets or processes. The backend's capacity is fixed.
func inmemGateway(tb testing.TB, sim enginesim.Config) *Gateway {
	tb.Helper()
	sim.Fast = true
	s, err := enginesim.New(sim)
	if err != nil {
		tb.Fatal(err)
	}
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: s.Handler(), CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	cfg, err := config.Parse([]byte(`
backends: [{name: sim, url: "http://127.0.0.1:1", role: unified}]
tenants: [{name: alice, key_sha256: "`+config.SHA256Hex("k")+`"}]
canary: {enabled: true, secret: "inmem test secret"}
capacity: {poll_interval: 1h}
`), nil)
	if err != nil {
		tb.Fatal(err)
	}
	set, err := backends.New(cfg.Backends, backends.OptionsFrom(cfg), zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	b := set.Get("sim")
	b.Client.Dial = func(string) (net.Conn, error) { return ln.Dial() }
	backends.SetCapacityForTest(b, &backends.Capacity{PoolTokens: 65536, MaxReqInputLen: 32000, ContextLen: 32768, ReadAt: time.Now().Add(time.Hour)})
	g, err := New(cfg, set, nil, zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	g.exact = nil
	return g
}

// serveOne runs one request through g.Handle and returns the status and the whole body (a
// stream read to its end).
func serveOne(tb testing.TB, g *Gateway, ctx *fasthttp.RequestCtx, path, body string) (int, []byte) {
	tb.Helper()
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI(path)
	ctx.Request.Header.Set("Authorization", "Bearer k")
	ctx.Request.SetBodyString(body)
	g.Handle(ctx)
	if s := ctx.Response.BodyStream(); s != nil {
		var sb strings.Builder
		_, err := io.Copy(&sb, s)
		_ = ctx.Response.CloseBodyStream()
		if err != nil {
			tb.Fatal(err)
		}
		return ctx.Response.StatusCode(), []byte(sb.String())
	}
	return ctx.Response.StatusCode(), ctx.Response.Body()
}
