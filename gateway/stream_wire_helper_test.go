package gateway_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/tests/testkit"
)

// This file holds the wire-level helpers of the stream write tests (stream_writes_test.go) and
// benchmarks: an engine that writes its replies byte for byte (so a test decides which events
// share a TCP write and which wait), and a client that sees the gateway's reply chunk by chunk
// (fasthttp writes each read of the relay as one chunk, and flushes it: one chunk, one write).

// rawStreamEngine is a healthy unified engine on loopback ("sim", as fakeUnified) whose
// generation replies gen writes on the connection itself, after the request was read whole.
// Connections are kept alive between requests, as an engine's are.
func rawStreamEngine(tb testing.TB, gen func(c net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			go serveRawEngine(c, gen)
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			_ = c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

func serveRawEngine(c net.Conn, gen func(c net.Conn)) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		switch req.URL.Path {
		case "/generate", "/v1/chat/completions", "/v1/completions":
			gen(c)
		case "/server_info":
			writeRawJSON(c, `{"max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":16,"disaggregation_mode":"null"}`)
		case "/v1/models":
			writeRawJSON(c, `{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`)
		case "/abort_request":
			writeRawJSON(c, `{}`)
		default:
			_, _ = io.WriteString(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
		}
	}
}

func writeRawJSON(c net.Conn, body string) {
	_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// quietGateway is a gateway with canaries on (hostileYAML) in front of the engine at url, logging
// nothing: its capacity poller may log once more after the test ends (a cancelled poll loop
// polls again when its tick is due too), which a test logger turns into a panic.
func quietGateway(tb testing.TB, url string) *testkit.Gateway {
	tb.Helper()
	return testkit.StartGatewayWithLogger(tb, testkit.ParseConfig(tb, hostileYAML(url, "")), zap.NewNop())
}

// sseHead starts a streamed reply as SGLang's server does: chunked, one chunk per event.
const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunk frames b as one HTTP chunk.
func chunk(b string) string { return strconv.FormatInt(int64(len(b)), 16) + "\r\n" + b + "\r\n" }

// chatEvent is content event k of a chat stream, its text "tok-<k> ".
func chatEvent(k int) string {
	return fmt.Sprintf(`data: {"id":"chatcmpl-w","object":"chat.completion.chunk","created":0,"model":"sim","choices":[{"index":0,"delta":{"content":"tok-%03d "},"logprobs":null,"finish_reason":null}]}`+"\n\n", k)
}

// chatEndChunks is a chat stream's last event and [DONE], each in its own chunk, and the last
// chunk.
func chatEndChunks() string {
	return chunk(`data: {"id":"chatcmpl-w","object":"chat.completion.chunk","created":0,"model":"sim","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`+"\n\n") +
		chunk("data: [DONE]\n\n") + "0\r\n\r\n"
}

// streamClient is one keep-alive connection to the gateway that reads streamed replies chunk by
// chunk.
type streamClient struct {
	c  net.Conn
	br *bufio.Reader
	tp *textproto.Reader
}

func dialStream(tb testing.TB, addr string) *streamClient {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		tb.Fatalf("dial %s: %v", addr, err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	br := bufio.NewReader(c)
	return &streamClient{c: c, br: br, tp: textproto.NewReader(br)}
}

// ask sends a streamed chat request with key and reads the reply's status line and headers.
func (s *streamClient) ask(tb testing.TB, key string) {
	tb.Helper()
	body := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":64,"stream":true}`
	_, err := fmt.Fprintf(s.c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", key, len(body), body)
	if err != nil {
		tb.Fatal(err)
	}
	line, err := s.tp.ReadLine()
	if err != nil {
		tb.Fatalf("status line: %v", err)
	}
	h, err := s.tp.ReadMIMEHeader()
	if err != nil {
		tb.Fatalf("headers: %v", err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 200") || h.Get("Transfer-Encoding") != "chunked" {
		tb.Fatalf("reply %q %v: want a chunked 200", line, h)
	}
}

// next is the reply's next chunk; io.EOF after its last chunk.
func (s *streamClient) next() ([]byte, error) {
	line, err := s.tp.ReadLine()
	if err != nil {
		return nil, err
	}
	size, err := strconv.ParseUint(strings.TrimSpace(strings.SplitN(line, ";", 2)[0]), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("chunk size line %q: %w", line, err)
	}
	if size == 0 {
		for { // the trailer section ends with an empty line
			if l, err := s.tp.ReadLine(); err != nil || l == "" {
				if err == nil {
					err = io.EOF
				}
				return nil, err
			}
		}
	}
	b := make([]byte, size+2)
	if _, err := io.ReadFull(s.br, b); err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(b, []byte("\r\n")) {
		return nil, fmt.Errorf("chunk not ended by CRLF")
	}
	return b[:size], nil
}

// readAll reads the rest of the reply: its body and its number of chunks.
func (s *streamClient) readAll() ([]byte, int, error) {
	var body []byte
	n := 0
	for {
		b, err := s.next()
		if err == io.EOF {
			return body, n, nil
		}
		if err != nil {
			return body, n, err
		}
		body = append(body, b...)
		n++
	}
}
