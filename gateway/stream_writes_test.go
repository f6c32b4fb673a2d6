package gateway_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Issue 33: the relay writes what is ready once the engine has nothing more buffered. These
// tests hold it to both halves: a lone event is never held back waiting for more, and events
// the engine sent back to back leave in a few writes, not one each. The engine and the client
// are byte-level (stream_wire_helper_test.go): each chunk the client reads is one write.

// handshakeWait bounds each wait for the other side: a failure bound on a busy machine, never
// the thing a test measures (the engine sends nothing more until the client has the event).
const handshakeWait = 20 * time.Second

// A lone event reaches the client while the engine holds the stream open and waits for the
// client to confirm it; whatever follows the event in the same TCP write (part of a size line, a
// size line alone, part of a chunk, a chunk without its last byte, a whole chunk holding half of
// the next event) must not make the gateway wait for more before writing the event.
func TestStreamLoneEventIsNotHeldBack(t *testing.T) {
	const events = 6
	for _, c := range []struct {
		name string
		// tail is how many bytes of the next event's chunk go in the same write as event k.
		tail func(next string) int
		// split sends each event after the first as two chunks, its halves: the first half's
		// chunk goes in event k's write, whole.
		split bool
	}{
		{"nothing after it", func(string) int { return 0 }, false},
		{"one digit of the next size line", func(string) int { return 1 }, false},
		{"the next size line without its LF", func(n string) int { return strings.Index(n, "\n") }, false},
		{"the next size line alone", func(n string) int { return strings.Index(n, "\n") + 1 }, false},
		{"part of the next chunk", func(n string) int { return strings.Index(n, "\n") + 20 }, false},
		{"the next chunk but its last byte", func(n string) int { return len(n) - 1 }, false},
		{"a whole chunk with half of the next event", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The reply as the engine sends it, cut into the writes it makes: write k completes
			// event k and carries what follows it; the engine makes write k+1 only once the
			// client has event k.
			head, rest := make([]string, events), make([]string, events) // event k = head[k]+rest[k]
			for k := range events {
				ev := chatEvent(k)
				switch {
				case c.split && k > 0:
					head[k], rest[k] = chunk(ev[:len(ev)/2]), chunk(ev[len(ev)/2:])
				case k > 0:
					whole := chunk(ev)
					n := c.tail(whole)
					head[k], rest[k] = whole[:n], whole[n:]
				default:
					rest[k] = chunk(ev)
				}
			}
			writes := make([]string, events)
			for k := range events {
				writes[k] = rest[k]
				if k+1 < events {
					writes[k] += head[k+1]
				}
			}
			writes[0] = sseHead + writes[0]
			writes[events-1] += chatEndChunks()
			got := make(chan int, events)
			done := make(chan struct{})
			defer close(done)
			url := rawStreamEngine(t, func(conn net.Conn) {
				for k, w := range writes {
					if _, err := io.WriteString(conn, w); err != nil {
						return
					}
					if k == len(writes)-1 {
						return
					}
					select {
					case <-got: // the client has event k: only now is more sent
					case <-done:
						_ = conn.Close() // the test ended early: so does the reply (and the relay's read)
						return
					case <-time.After(handshakeWait):
						_ = conn.Close()
						return
					}
				}
			})
			gw := quietGateway(t, url)
			cl := dialStream(t, gw.Addr)
			_ = cl.c.SetDeadline(time.Now().Add(handshakeWait))
			cl.ask(t, requesterKey)
			var body []byte
			for k := range events {
				want := []byte(fmt.Sprintf(`"tok-%03d `, k))
				for !bytes.Contains(body, want) {
					b, err := cl.next()
					if err != nil {
						t.Fatalf("event %d did not reach the client while the engine waited for it (held back?): %v; got so far:\n%s", k, err, body)
					}
					body = append(body, b...)
				}
				got <- k
			}
			tail, _, err := cl.readAll()
			if body = append(body, tail...); err != nil || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
				t.Fatalf("the stream did not end cleanly: %v\n%s", err, body)
			}
		})
	}
}

// 64 events the engine sends back to back in one TCP write reach the client in a few writes
// (the relay reads on while the engine's bytes are buffered), not one write per event, and
// arrive whole and in order.
func TestStreamBurstLeavesInFewWrites(t *testing.T) {
	const events = 64
	var burst strings.Builder
	burst.WriteString(sseHead)
	for k := range events {
		burst.WriteString(chunk(chatEvent(k)))
	}
	burst.WriteString(chatEndChunks())
	url := rawStreamEngine(t, func(c net.Conn) { _, _ = io.WriteString(c, burst.String()) })
	gw := quietGateway(t, url)
	cl := dialStream(t, gw.Addr)
	_ = cl.c.SetDeadline(time.Now().Add(handshakeWait))
	cl.ask(t, requesterKey)
	body, writes, err := cl.readAll()
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	at := 0
	for k := range events {
		i := bytes.Index(body[at:], []byte(fmt.Sprintf(`"tok-%03d `, k)))
		if i < 0 {
			t.Fatalf("event %d missing or out of order:\n%s", k, body)
		}
		at += i
	}
	// The reply is about 12 KB: fasthttp reads the engine 4 KB at a time and hands out 4 KB per
	// read of the relay, so a few writes; one per event would be 66.
	t.Logf("%d events (%d bytes) in %d writes", events, len(body), writes)
	if writes > events/8 {
		t.Fatalf("%d events sent back to back took %d writes to the client; want at most %d", events, writes, events/8)
	}
}

// Coalescing never lets a leaking event out: a burst with another tenant's marker in its tenth
// event is cut there. The client gets the clean events before it and the error event, and no
// byte of the marker or of any event after it.
func TestStreamBurstCutBeforeTheLeak(t *testing.T) {
	defaults := testkit.ParseConfig(t, hostileYAML("http://127.0.0.1:1", "")).Canary // the marker's epoch and window
	victim, _ := canary.NewKeyring([]byte(canarySecret), defaults.Epoch, defaults.DetectWindow, []string{"alice", "bob"}).Current("alice", time.Now())
	var burst strings.Builder
	burst.WriteString(sseHead)
	for k := range 40 {
		ev := chatEvent(k)
		if k == 10 {
			ev = strings.Replace(ev, "tok-010 ", "tok-010 "+victim, 1)
		}
		burst.WriteString(chunk(ev))
	}
	burst.WriteString(chatEndChunks())
	url := rawStreamEngine(t, func(c net.Conn) { _, _ = io.WriteString(c, burst.String()) })
	gw := quietGateway(t, url)
	cl := dialStream(t, gw.Addr)
	_ = cl.c.SetDeadline(time.Now().Add(handshakeWait))
	cl.ask(t, requesterKey)
	body, _, err := cl.readAll()
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	if bytes.Contains(body, []byte(victim)) || bytes.Contains(body, []byte(victim[:12])) {
		t.Fatalf("the marker reached the client:\n%s", body)
	}
	if !bytes.Contains(body, []byte(`"tok-009 `)) || bytes.Contains(body, []byte(`"tok-011 `)) {
		t.Fatalf("want events 0-9 and nothing after event 10:\n%s", body)
	}
	if !bytes.Contains(body, []byte("upstream_integrity")) {
		t.Fatalf("no error event after the cut:\n%s", body)
	}
}
