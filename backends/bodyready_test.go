package backends

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/config"
)

// wireEngine answers one streamed request on loopback with head, then each of more once the
// test asks for it (by a send on next): the test decides which bytes share a TCP write.
func wireEngine(t *testing.T, head string, more ...string) (url string, next chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	next = make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(done); _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, head)
		for _, m := range more {
			select {
			case <-next:
			case <-done:
				return
			}
			_, _ = io.WriteString(c, m)
		}
		<-done
	}()
	return "http://" + ln.Addr().String(), next
}

func sendStream(t *testing.T, url string) *Leg {
	t.Helper()
	s := newTestSet(t, config.Backend{Name: "e", URL: url, Role: config.RoleUnified})
	l, err := s.Get("e").Send("/generate", []byte(`{"text":"hi","stream":true}`), []string{"r"}, "rid", "", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Release)
	return l
}

// read is one read of the leg's body, failing the test on an error.
func read(t *testing.T, body io.Reader, p []byte) string {
	t.Helper()
	n, err := body.Read(p)
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return string(p[:n])
}

// BodyReady is true exactly while the next read would take a whole chunk from the connection's
// read buffer, and false wherever a read could wait for the engine: nothing buffered, part of a
// chunk (its size line, its bytes, its line end), the last chunk, a read that stopped inside a
// chunk, a size line with an extension.
func TestBodyReadyFollowsTheReadBuffer(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	url, next := wireEngine(t, head+"1\r\nA\r\n2\r\nBB\r\n3\r\nCCC\r\n",
		"1\r\nD\r\n4\r\nEE", "EE\r\n",
		"a\r\n0123456789\r\n1\r\nF\r\n1;x=1\r\nG\r\n", "0\r\n\r\n")
	l := sendStream(t, url)
	body := l.Body()
	p := make([]byte, 64)
	if got := read(t, body, p); got != "A" || !l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with two whole chunks buffered", got, l.BodyReady())
	}
	if got := read(t, body, p); got != "BB" || !l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with one whole chunk buffered", got, l.BodyReady())
	}
	if got := read(t, body, p); got != "CCC" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with nothing buffered", got, l.BodyReady())
	}
	next <- struct{}{} // "D", then half of "EEEE"
	if got := read(t, body, p); got != "D" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with half a chunk buffered", got, l.BodyReady())
	}
	next <- struct{}{}
	if got := read(t, body, p) + read(t, body, p); got != "EEEE" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v", got, l.BodyReady())
	}
	next <- struct{}{} // a 10-byte chunk read 4 bytes at a time, "F", "G" with an extension
	if got := read(t, body, p[:4]); got != "0123" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v inside a chunk (its line end may be missing)", got, l.BodyReady())
	}
	if got := read(t, body, p[:4]) + read(t, body, p[:4]); got != "456789" || !l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v at the chunk's end with the next one buffered", got, l.BodyReady())
	}
	if got := read(t, body, p); got != "F" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with a chunk whose size line has an extension", got, l.BodyReady())
	}
	if got := read(t, body, p); got != "G" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v", got, l.BodyReady())
	}
	next <- struct{}{}
	if n, err := body.Read(p); n != 0 || err != io.EOF {
		t.Fatalf("the last chunk: %d, %v", n, err)
	}
}

// The 1-byte read above reached BodyReady's whole-chunk test only if the connection's reader was
// found in fasthttp's stream: a fasthttp whose internals moved fails here (and the relay would
// write after every read again), not silently.
func TestConnReaderFound(t *testing.T) {
	url, _ := wireEngine(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n1\r\nB\r\n0\r\n\r\n")
	l := sendStream(t, url)
	_ = l.Body()
	if br := connReader(l.body.s); br == nil {
		t.Fatalf("no *bufio.Reader found behind %T: fasthttp's clientStreamBody or requestStream changed", l.body.s)
	}
}

// Not chunked: any buffered byte is returned by the next read.
func TestBodyReadyUnchunked(t *testing.T) {
	url, next := wireEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 6\r\n\r\nabc", "def")
	l := sendStream(t, url)
	body := l.Body()
	p := make([]byte, 2)
	if got := read(t, body, p); got != "ab" || !l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with a byte buffered", got, l.BodyReady())
	}
	if got := read(t, body, p); got != "c" || l.BodyReady() {
		t.Fatalf("read %q; BodyReady %v with nothing buffered", got, l.BodyReady())
	}
	next <- struct{}{}
	if got := read(t, body, make([]byte, 8)); got != "def" {
		t.Fatalf("read %q", got)
	}
}

func TestWholeChunk(t *testing.T) {
	for b, want := range map[string]bool{
		"1\r\nA\r\n":          true,
		"1\r\nA\r\n2\r\n":     true,
		"A\r\n0123456789\r\n": true,
		"a\r\n0123456789\r\n": true,
		"":                    false,
		"1":                   false,
		"1\r":                 false,
		"1\r\n":               false,
		"1\r\nA":              false,
		"1\r\nA\r":            false,
		"1\r\nAB\r\n":         false, // the size says 1: "B" is no line end
		"0\r\n\r\n":           false, // the last chunk: its trailers may not be here
		"1;x\r\nA\r\n":        false, // an extension: not worth parsing
		"1 \r\nA\r\n":         false,
		"\r\nA\r\n":           false,
		"g\r\nA\r\n":          false,
		"fffffff0\r\nA\r\n":   false, // more digits than parsed
	} {
		if got := wholeChunk([]byte(b)); got != want {
			t.Errorf("wholeChunk(%q) = %v, want %v", b, got, want)
		}
	}
}
