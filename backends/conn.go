package backends

import (
	"errors"
	"net"
	"sync"
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
	conns                      *connSet
}

// ErrCut is the read error of every engine reply cut by Set.CutStreams.
var ErrCut = errors.New("engine reply cut at the end of the gateway's drain")

// connSet is a backend's open request connections, so that the end of a drain can end every
// reply still being read, wherever its reader is blocked.
type connSet struct {
	cut atomic.Bool // once set, every read and dial fails with ErrCut
	mu  sync.Mutex
	m   map[*timedConn]struct{}
}

// cutAll fails every read in progress or to come. The flag is set before the deadlines, and
// Read checks it again after setting its own deadline, so no read can outlast the cut.
func (s *connSet) cutAll() {
	s.cut.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m {
		_ = c.Conn.SetReadDeadline(time.Unix(1, 0))
	}
}

func (c *timedConn) Close() error {
	c.conns.mu.Lock()
	delete(c.conns.m, c)
	c.conns.mu.Unlock()
	return c.Conn.Close()
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.awaitingFirstByte.Store(true)
	return c.Conn.Write(p)
}

func (c *timedConn) Read(p []byte) (int, error) {
	if c.conns.cut.Load() {
		return 0, ErrCut
	}
	d := c.idleTimeout
	if c.awaitingFirstByte.Load() {
		d = c.headerTimeout
	}
	if d > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
			return 0, err
		}
		if c.conns.cut.Load() { // cutAll's past deadline may have come before ours
			return 0, ErrCut
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaitingFirstByte.Store(false)
	}
	return n, err
}

func timedDialer(connectTimeout, headerTimeout, idleTimeout time.Duration, conns *connSet) fasthttp.DialFunc {
	return func(addr string) (net.Conn, error) {
		if conns.cut.Load() {
			return nil, ErrCut
		}
		c, err := fasthttp.DialTimeout(addr, connectTimeout)
		if err != nil {
			return nil, err
		}
		tc := &timedConn{Conn: c, headerTimeout: headerTimeout, idleTimeout: idleTimeout, conns: conns}
		conns.mu.Lock()
		conns.m[tc] = struct{}{}
		cut := conns.cut.Load()
		conns.mu.Unlock()
		if cut { // dialled while cutAll ran
			_ = tc.Close()
			return nil, ErrCut
		}
		return tc, nil
	}
}
