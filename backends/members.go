package backends

// Membership: which backends the set holds now. Configured entries are members as they are; an
// entry with discover: dns stands for one member per address its host resolves to. A change
// (a new answer, a reconfiguration) builds the new list: unchanged members are kept as they are
// (their capacity, calibration and connections), new ones join unpolled (so they take no traffic
// until a capacity reading says what they hold), and those that left stop being polled and
// routed to while the requests that hold them finish.

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/panics"
)

// apply rebuilds the member list from s.static and s.discovered. On an error (a member that
// cannot be built) nothing changes.
func (s *Set) apply() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var want []config.Backend
	for _, c := range s.static {
		if c.Discover == "dns" {
			want = append(want, s.discovered[c.Name]...)
		} else {
			want = append(want, c)
		}
	}
	list := make([]*Backend, 0, len(want))
	byName := make(map[string]*Backend, len(want))
	for _, c := range want {
		if cur := s.byName[c.Name]; cur != nil && cur.conf == c {
			list, byName[c.Name] = append(list, cur), cur
			continue
		}
		b, err := s.newBackend(c)
		if err != nil {
			return err
		}
		if until, ok := s.quarantine[c.Name]; ok {
			b.quarantinedUntil.Store(until.UnixNano())
		}
		list, byName[c.Name] = append(list, b), b
	}
	for name, old := range s.byName {
		if byName[name] != old {
			if stop := s.pollers[old]; stop != nil {
				stop()
				delete(s.pollers, old)
			}
			if s.runCtx != nil {
				s.log.Info("backend left: no new requests; those in flight finish", zap.String("backend", name), zap.String("addr", old.Addr))
			}
		}
	}
	for _, b := range list {
		if s.runCtx != nil && s.pollers[b] == nil {
			s.log.Info("backend joined: polled for capacity before it takes traffic", zap.String("backend", b.Name), zap.String("addr", b.Addr))
			s.startPollerLocked(b)
		}
	}
	s.list, s.byName = list, byName
	return nil
}

// startPollerLocked polls b every poll interval (the first at once) until it leaves or Run's
// context ends. s.mu is held.
func (s *Set) startPollerLocked(b *Backend) {
	ctx, stop := context.WithCancel(s.runCtx)
	s.pollers[b] = stop
	s.pollWG.Add(1)
	go func() {
		defer s.pollWG.Done()
		t := time.NewTicker(s.opts.PollInterval)
		defer t.Stop()
		for {
			s.pollSafely(b)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Reconfigure replaces the configured entries (a reload): members are rebuilt as apply says,
// discover entries' resolvers restarted. On an error nothing changes.
func (s *Set) Reconfigure(cfgs []config.Backend, d config.Discovery) error {
	s.mu.Lock()
	oldStatic, oldDiscovery := s.static, s.opts.Discovery
	s.static, s.opts.Discovery = append([]config.Backend(nil), cfgs...), d
	s.mu.Unlock()
	if err := s.apply(); err != nil {
		s.mu.Lock()
		s.static, s.opts.Discovery = oldStatic, oldDiscovery
		s.mu.Unlock()
		return err
	}
	s.mu.RLock()
	ctx := s.runCtx
	s.mu.RUnlock()
	if ctx != nil {
		s.runDiscovery(ctx)
	}
	return nil
}

// resolver is one discover entry's running loop.
type resolver struct {
	key  string // the entry and discovery settings it runs with: a change restarts it
	ctx  context.Context
	stop context.CancelFunc
}

// runDiscovery starts a resolver loop for every discover entry that has none (stopping those of
// entries gone or changed); each new one answers once before this returns, so members exist as
// soon as the set runs.
func (s *Set) runDiscovery(ctx context.Context) {
	s.mu.Lock()
	d := s.opts.Discovery
	want := map[string]config.Backend{}
	for _, c := range s.static {
		if c.Discover == "dns" {
			want[c.Name] = c
		}
	}
	key := func(c config.Backend) string { return fmt.Sprintf("%+v|%+v", c, d) }
	if s.resolving == nil {
		s.resolving = map[string]resolver{}
	}
	for name, r := range s.resolving {
		if c, ok := want[name]; !ok || key(c) != r.key {
			r.stop()
			delete(s.resolving, name)
		}
	}
	var start []config.Backend
	for name, c := range want {
		if _, ok := s.resolving[name]; !ok {
			rctx, stop := context.WithCancel(ctx)
			s.resolving[name] = resolver{key: key(c), ctx: rctx, stop: stop}
			start = append(start, c)
		}
	}
	s.mu.Unlock()
	for _, c := range start {
		s.mu.RLock()
		rctx := s.resolving[c.Name].ctx
		s.mu.RUnlock()
		if rctx == nil {
			continue
		}
		s.resolveOnce(rctx, c, d)
		go panics.Loop(rctx, s.log, "discovery", d.Interval, func(ctx context.Context) {
			t := time.NewTicker(d.Interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				s.resolveOnce(ctx, c, d)
			}
		})
	}
}

// resolveOnce resolves entry c's host and, when the addresses changed, its members. A failed
// lookup keeps the members it had: a resolver's hiccup must not drain a fleet.
func (s *Set) resolveOnce(ctx context.Context, c config.Backend, d config.Discovery) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return // validated by config
	}
	_, hostPort, _ := c.Address()
	_, port, _ := net.SplitHostPort(hostPort)
	host := u.Hostname()
	r := net.DefaultResolver
	if d.Resolver != "" {
		r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var dialer net.Dialer
			return dialer.DialContext(ctx, network, d.Resolver)
		}}
	}
	lctx, cancel := context.WithTimeout(ctx, max(d.Interval, time.Second))
	ips, err := r.LookupIP(lctx, "ip", host)
	cancel()
	s.mu.Lock()
	s.answered[c.Name] = true
	s.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("discovery: lookup failed; members kept", zap.String("backend", c.Name), zap.String("host", host), zap.Error(err))
		}
		return
	}
	addrs := make([]string, 0, len(ips))
	for _, ip := range ips {
		addrs = append(addrs, ip.String())
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	members := make([]config.Backend, 0, len(addrs))
	for _, a := range addrs {
		m := c
		m.Discover = ""
		m.Name = c.Name + "@" + a
		m.URL = u.Scheme + "://" + net.JoinHostPort(a, port)
		if u.Scheme == "https" && m.TLS.ServerName == "" {
			m.TLS.ServerName = host // the certificate is for the name, not for each address
		}
		members = append(members, m)
	}
	s.mu.Lock()
	if ctx.Err() != nil { // the entry was reconfigured meanwhile
		s.mu.Unlock()
		return
	}
	same := slices.Equal(members, s.discovered[c.Name])
	s.discovered[c.Name] = members
	s.mu.Unlock()
	if !same {
		if err := s.apply(); err != nil {
			s.log.Error("discovery: members not applied", zap.String("backend", c.Name), zap.Error(err))
		}
	}
}
