package admin

// The throttle on guessing the admin and metrics keys: per client address, a few failures are
// answered, then each further one makes the address wait twice as long, and enough of them lock
// it out (issue 31: the status page's login answered 200 wrong keys in 0.2 s).

import (
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/config"
)

// Where a key was tried: the label of the throttle's metrics.
const (
	ViaLogin   = "login"   // the status page's login form
	ViaBearer  = "bearer"  // a bearer key on an admin route
	ViaMetrics = "metrics" // a bearer key on /metrics
)

// Throttle is the table of client addresses with recent failures. Safe for concurrent use.
type Throttle struct {
	cfg config.AuthThrottle
	mu  sync.Mutex
	m   map[netip.Addr]*strikes
	// overflow is the one entry every address shares once m is full of live entries.
	overflow strikes

	failures  *prometheus.CounterVec
	throttled *prometheus.CounterVec
	// OnLockout, when set, is told when an address is locked out (for the log).
	OnLockout func(addr netip.Addr, failures int)
}

// strikes are one address's failures.
type strikes struct {
	failures int
	last     time.Time // the latest failure
	until    time.Time // no key is checked for this address before then
}

// NewThrottle is an empty table with cfg's schedule; its metrics are registered on reg (nil:
// not registered).
func NewThrottle(cfg config.AuthThrottle, reg prometheus.Registerer) *Throttle {
	t := &Throttle{cfg: cfg, m: map[netip.Addr]*strikes{},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_admin_auth_failures_total",
			Help: "Wrong admin or metrics keys, by where they were tried (login, bearer, metrics)."}, []string{"via"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_admin_auth_throttled_total",
			Help: "Key attempts refused with 429 unchecked because their client address is backing off or locked out, by where they were tried."}, []string{"via"}),
	}
	for _, via := range []string{ViaLogin, ViaBearer, ViaMetrics} {
		t.failures.WithLabelValues(via)
		t.throttled.WithLabelValues(via)
	}
	if reg != nil {
		reg.MustRegister(t.failures, t.throttled)
	}
	return t
}

// key is the table's key for ip: IPv6 addresses by their /64, since one host commonly holds a
// whole /64 and could otherwise take a fresh address for every guess.
func key(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// entry is ip's strikes (nil if none), or the shared one once the table is full of others.
// Called with mu held.
func (t *Throttle) entry(k netip.Addr) *strikes {
	if s := t.m[k]; s != nil {
		return s
	}
	if len(t.m) >= t.cfg.MaxAddresses {
		return &t.overflow
	}
	return nil
}

// stale: s's failures are forgotten (Lockout after the last, and no wait pending).
func (t *Throttle) stale(s *strikes, now time.Time) bool {
	return !now.Before(s.until) && now.Sub(s.last) >= t.cfg.Lockout
}

// Wait is how long ip must wait before a key it sends is checked (0: check it now).
func (t *Throttle) Wait(ip netip.Addr, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.entry(key(ip))
	if s == nil || !now.Before(s.until) {
		return 0
	}
	return s.until.Sub(now)
}

// Fail records a wrong key from ip, tried via, and sets the address's wait.
func (t *Throttle) Fail(ip netip.Addr, via string, now time.Time) {
	t.failures.WithLabelValues(via).Inc()
	k := key(ip)
	t.mu.Lock()
	s := t.entry(k)
	if s == nil || s == &t.overflow {
		t.sweep(now)
		if s = t.entry(k); s == nil {
			s = &strikes{}
			t.m[k] = s
		}
	}
	if t.stale(s, now) {
		*s = strikes{}
	}
	s.failures++
	s.last = now
	n := s.failures
	locked := false
	switch {
	case n >= t.cfg.LockoutAfter:
		s.until, locked = now.Add(t.cfg.Lockout), n == t.cfg.LockoutAfter
	case n >= t.cfg.FreeFailures:
		wait := t.cfg.Backoff << min(n-t.cfg.FreeFailures, 30)
		if wait <= 0 || wait > t.cfg.Lockout {
			wait = t.cfg.Lockout
		}
		s.until = now.Add(wait)
	}
	t.mu.Unlock()
	if locked && t.OnLockout != nil {
		t.OnLockout(k, n)
	}
}

// Throttled counts a key attempt refused unchecked.
func (t *Throttle) Throttled(via string) { t.throttled.WithLabelValues(via).Inc() }

// sweep forgets stale addresses (called with mu held, when the table may be full).
func (t *Throttle) sweep(now time.Time) {
	if len(t.m) < t.cfg.MaxAddresses {
		return
	}
	for k, s := range t.m {
		if t.stale(s, now) {
			delete(t.m, k)
		}
	}
	if t.stale(&t.overflow, now) {
		t.overflow = strikes{}
	}
}

// Len is how many addresses the table holds.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// tooManyFailures is the 429 an address gets while it waits: its key is not checked.
func tooManyFailures(wait time.Duration) *apierr.Error {
	secs := max(int((wait+time.Second-1)/time.Second), 1)
	return &apierr.Error{Status: 429, Type: "invalid_request_error", Code: "too_many_auth_failures", RetryAfter: secs,
		Message: "Too many wrong keys from this address: try again in " + strconv.Itoa(secs) + "s."}
}
