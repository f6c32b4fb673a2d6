package gateway_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// rawReq is one HTTP/1.1 request written byte for byte, so that a test can send what no
// well-behaved client library would: conflicting framing, bad chunk sizes, NUL bytes, dribbled
// headers.
type rawReq struct {
	method, path string
	// headers are written in order after Host; "Authorization" and "Content-Type" defaults are
	// added unless noAuth / a Content-Type is given; Content-Length is added unless noLength or a
	// Transfer-Encoding or Content-Length header is given.
	headers  [][2]string
	body     []byte
	key      string
	noAuth   bool
	noLength bool
	// raw, when set, is sent as is instead of building anything.
	raw []byte
}

func (r rawReq) bytes() []byte {
	if r.raw != nil {
		return r.raw
	}
	var b bytes.Buffer
	method := r.method
	if method == "" {
		method = "POST"
	}
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: gw\r\n", method, r.path)
	hasCT, hasLen := false, false
	for _, h := range r.headers {
		switch http.CanonicalHeaderKey(h[0]) {
		case "Content-Type":
			hasCT = true
		case "Content-Length", "Transfer-Encoding":
			hasLen = true
		}
		fmt.Fprintf(&b, "%s: %s\r\n", h[0], h[1])
	}
	if !r.noAuth {
		key := r.key
		if key == "" {
			key = tenantKey
		}
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", key)
	}
	if !hasCT {
		b.WriteString("Content-Type: application/json\r\n")
	}
	if !hasLen && !r.noLength {
		b.WriteString("Content-Length: " + strconv.Itoa(len(r.body)) + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(r.body)
	return b.Bytes()
}

// rawReply is what came back on the connection: the first response (nil if none) and whether
// the gateway closed the connection after it.
type rawReply struct {
	resp   *http.Response
	body   []byte
	err    error
	closed bool
}

// sendRaw writes req on a fresh loopback connection and reads one response (bounded by within).
func sendRaw(t testing.TB, addr string, req []byte, within time.Duration) rawReply {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(within))
	// Write in a goroutine: the gateway may answer (413) and close before taking a large body.
	go func() { _, _ = c.Write(req) }()
	return readRaw(c)
}

func readRaw(c net.Conn) rawReply {
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return rawReply{err: err}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	resp.Body.Close()
	out := rawReply{resp: resp, body: body, err: err}
	if resp.Close {
		out.closed = true
	} else {
		// Is anything else there? A closed connection reads EOF at once.
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := br.ReadByte(); err == io.EOF {
			out.closed = true
		}
	}
	return out
}
