package gateway

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/tests/markerhour"
)

// inmemGateway is a gateway (tenant "alice", key "k", canaries on) whose one unified backend is
// a fast-mode simulator served in this process on loopback: the whole request path runs without
// other processes. The backend's capacity is fixed (no polling).
func inmemGateway(tb testing.TB, sim enginesim.Config) *Gateway {
	tb.Helper()
	sim.Fast = true
	s, err := enginesim.New(sim)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: s.Handler(), CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	g, set := gatewayFor(tb, `
backends: [{name: sim, url: "http://`+ln.Addr().String()+`", role: unified}]
tenants: [{name: alice, key_sha256: "`+config.SHA256Hex("k")+`"}]
canary: {enabled: true, secret: "inmem test secret, padded to 32 bytes"}
capacity: {poll_interval: 1h}
`)
	backends.SetCapacityForTest(set.Get("sim"), &backends.Capacity{PoolTokens: 65536, MaxReqInputLen: 32000, ContextLen: 32768, ReadAt: time.Now().Add(time.Hour)})
	return g
}

// gatewayFor is an in-process gateway built from yaml (not serving, not polling), that asks no
// engine for exact counts.
func gatewayFor(tb testing.TB, yaml string) (*Gateway, *backends.Set) {
	tb.Helper()
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		tb.Fatal(err)
	}
	markerhour.Pin(cfg)
	set, err := backends.New(cfg.Backends, backends.OptionsFrom(cfg), zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	g, err := New(cfg, set, nil, zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	g.count.WithoutExact()
	return g, set
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
