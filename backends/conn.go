package backends

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// timedConn gives fasthttp the two timeouts a streaming proxy needs and fasthttp lacks (its
// ReadTimeout is a total deadline that cuts long streams, see field-notes.md): after a request is
// written, the first response byte must come within headerTimeout; after that, every read must
// make progress within idleTimeout. The deadline is set on each Read, so a stream may last as long
// as it keeps talking.
type timedConn struct {
	net.Conn
	headerTimeout, idleTimeout time.Duration
	awaitingFirstByte          atomic.Bool
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.awaitingFirstByte.Store(true)
	return c.Conn.Write(p)
}

func (c *timedConn) Read(p []byte) (int, error) {
	d := c.idleTimeout
	if c.awaitingFirstByte.Load() {
		d = c.headerTimeout
	}
	if d > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaitingFirstByte.Store(false)
	}
	return n, err
}

func timedDialer(connectTimeout, headerTimeout, idleTimeout time.Duration) fasthttp.DialFunc {
	return func(addr string) (net.Conn, error) {
		c, err := fasthttp.DialTimeout(addr, connectTimeout)
		if err != nil {
			return nil, err
		}
		return &timedConn{Conn: c, headerTimeout: headerTimeout, idleTimeout: idleTimeout}, nil
	}
}
