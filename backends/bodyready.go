package backends

import (
	"bufio"
	"io"
	"reflect"
)

// This file answers one question for the stream relay: would the next read of a streamed reply
// wait for the engine? An engine writes each event as its own chunk and fasthttp's body stream
// returns at most one chunk per read, so a relay that writes to the client after every read pays
// one write system call per event even when the next events are already here (issue 33: 35% of
// the gateway's CPU for replies sent back to back). With this answer the relay reads on while the
// engine's bytes are buffered and writes once, and never waits on the network holding a complete
// event back.

// legBody is a leg's streamed reply body: fasthttp's stream, with what BodyReady needs to know.
type legBody struct {
	s        io.Reader     // fasthttp's body stream
	br       *bufio.Reader // the connection's read buffer behind s; nil when not found
	resolved bool          // br was looked for (on the first BodyReady: whole replies never ask)
	chunked  bool          // Transfer-Encoding: chunked
	// boundary: the last read ended at a chunk's end (or nothing was read yet), so the buffered
	// bytes start with a chunk's size line.
	boundary bool
}

func (b *legBody) Read(p []byte) (int, error) {
	n, err := b.s.Read(p)
	// fasthttp reads min(chunk left, len(p)) bytes: a shorter read either finished its chunk or
	// emptied the read buffer (then nothing is buffered and BodyReady is false anyway).
	b.boundary = n < len(p)
	return n, err
}

// BodyReady says whether the next Read of Body returns without waiting for the engine: what it
// needs is in the connection's read buffer already (for a chunked body, one whole chunk: its size
// line, its bytes and the line end after them). False whenever that cannot be told: nothing
// buffered, part of a chunk, a size line with extensions, the last chunk, a read that stopped
// inside a chunk, an encoded body, a fasthttp whose internals differ. A false costs one write to
// the client; a wrong true could hold a complete event back until the engine sends more.
// Call it only between reads of Body, on the goroutine that reads it, before Release.
func (l *Leg) BodyReady() bool {
	b := &l.body
	if b.s == nil {
		return false
	}
	if !b.resolved {
		b.br, b.resolved = connReader(b.s), true
	}
	if b.br == nil {
		return false
	}
	n := b.br.Buffered()
	if n == 0 {
		return false
	}
	if !b.chunked {
		return true // an unchunked body's read returns what is buffered
	}
	if !b.boundary {
		return false // the rest of this chunk may be here without the line end that closes it
	}
	buf, _ := b.br.Peek(n) // no more than is buffered: no read
	return wholeChunk(buf)
}

// wholeChunk says b starts with a complete chunk of data: a size line of hex digits alone (no
// extensions), that many bytes and CRLF. The last chunk (size 0) is not one: the trailer section
// after it may not be here.
func wholeChunk(b []byte) bool {
	size, i := 0, 0
	for ; i < len(b) && i < 7; i++ { // 7 digits: up to 256 MiB, no overflow on any int size
		d := hexDigit(b[i])
		if d < 0 {
			break
		}
		size = size<<4 | d
	}
	if i == 0 || size == 0 || len(b) < i+2 || b[i] != '\r' || b[i+1] != '\n' {
		return false
	}
	end := i + 2 + size
	return len(b) >= end+2 && b[end] == '\r' && b[end+1] == '\n'
}

func hexDigit(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

var bufioReaderType = reflect.TypeFor[*bufio.Reader]()

// connReader is the *bufio.Reader a streamed reply of fasthttp's HostClient is read from.
// fasthttp keeps it in unexported fields (its clientStreamBody's reader, a *requestStream, reads
// from it) and offers no other way to ask what is buffered, so it is found by reflection, once
// per reply, and only Buffered and Peek are called on it, on the goroutine that reads the body,
// before the body is closed (then the reader goes back to fasthttp's pool). nil when the shape
// differs (another fasthttp version): TestConnReaderFound fails then, and the relay writes after
// every read, as it did before.
func connReader(s io.Reader) *bufio.Reader {
	v := reflect.ValueOf(s)
	if !isFasthttpStruct(v, "clientStreamBody") {
		return nil
	}
	if v = v.Elem().FieldByName("reader"); !v.IsValid() || v.Kind() != reflect.Interface || v.IsNil() {
		return nil
	}
	if v = v.Elem(); !isFasthttpStruct(v, "requestStream") {
		return nil
	}
	if v = v.Elem().FieldByName("reader"); !v.IsValid() || v.Type() != bufioReaderType || v.IsNil() {
		return nil
	}
	return (*bufio.Reader)(v.UnsafePointer())
}

func isFasthttpStruct(v reflect.Value, name string) bool {
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return false
	}
	t := v.Type().Elem()
	return t.Kind() == reflect.Struct && t.PkgPath() == "github.com/valyala/fasthttp" && t.Name() == name
}
