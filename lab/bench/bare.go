package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// The bare proxy: the least a fasthttp reverse proxy does (forward the request as it came,
// stream event-stream replies chunk by chunk, pass whole replies whole), built from the same
// fasthttp as kvgate. It is the floor for this stack: what kvgate's pipeline adds is measured
// against it. It runs as its own process (this binary, -role bare) so it gets the same share of
// the machine as nginx and kvgate.

func runBare(listen, upstream string) int {
	client := &fasthttp.HostClient{
		Addr:               upstream,
		StreamResponseBody: true,
		MaxConns:           1 << 16,
		MaxConnWaitTimeout: time.Second,
	}
	srv := &fasthttp.Server{Handler: bareHandler(client), Name: "bare", NoDefaultServerHeader: true, CloseOnShutdown: true}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sig; _ = srv.Shutdown() }()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "bare:", err)
		return 1
	}
	return 0
}

func bareHandler(client *fasthttp.HostClient) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		req := &ctx.Request
		req.Header.Del("Connection") // hop-by-hop
		resp := fasthttp.AcquireResponse()
		if err := client.Do(req, resp); err != nil {
			fasthttp.ReleaseResponse(resp)
			ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
			return
		}
		resp.Header.CopyTo(&ctx.Response.Header)
		ctx.Response.Header.Del("Connection")
		if bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) && resp.BodyStream() != nil {
			ctx.Response.ImmediateHeaderFlush = true
			ctx.Response.SetBodyStream(&releasing{Reader: resp.BodyStream(), resp: resp}, -1)
			return
		}
		defer fasthttp.ReleaseResponse(resp)
		body := resp.Body()
		if s := resp.BodyStream(); s != nil {
			var b bytes.Buffer
			_, err := io.Copy(&b, s)
			_ = resp.CloseBodyStream()
			if err != nil {
				ctx.Response.Reset()
				ctx.Error("upstream body: "+err.Error(), fasthttp.StatusBadGateway)
				return
			}
			body = b.Bytes()
		}
		ctx.Response.SetBody(body)
	}
}

// releasing is a streamed upstream body; fasthttp calls Close when the client's body is done or
// the client is gone, and the upstream response goes back to its pool then.
type releasing struct {
	io.Reader
	resp *fasthttp.Response
}

func (r *releasing) Close() error {
	_ = r.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(r.resp)
	return nil
}
