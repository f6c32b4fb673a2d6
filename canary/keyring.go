package canary

import (
	"crypto/hmac"
	"crypto/sha256"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Owner is who a marker belongs to.
type Owner struct {
	Tenant string
	Epoch  uint64
}

type curMarker struct {
	epoch  uint64
	marker string
}

type tenantState struct {
	name string
	cur  atomic.Pointer[curMarker] // cache for Current: one HMAC per tenant per epoch
}

// ring is one immutable state of the keyring: the tenants, every live marker (recs) and the sets
// of their windows. Readers load it once (Keyring.ring) and use it without locks; Refresh and
// AddTenant build the next one off to the side and swap it in, so a scan never waits on them.
//
// recs[:nbase] are in base, recs[nbase:] (markers of tenants added since base was built) in
// delta, a small set rebuilt with each addition until it grows past a fraction of base, when
// both are merged. A later ring may append to recs past this ring's length (never within it).
type ring struct {
	tenants   []*tenantState
	tenantIdx map[string]uint32
	recs      []markerRec
	nbase     int
	base      winSet
	delta     winSet
	lo, hi    uint64 // live epochs, inclusive; valid when live
	live      bool
	// recsGen changes when markers move in recs (a refresh): a detector holding indexes into
	// recs across Feeds drops them then.
	recsGen uint64
}

// Keyring derives and recognizes markers. Epoch = unix time / epochLen. A marker is live (known to
// Lookup and the scanners) while its epoch lies within the detect window before now, plus the
// next epoch so that a replica whose clock runs slightly ahead is still recognized. Lookups are a
// probe of a window set by the marker's first 8 characters, whatever the number of live markers.
//
// Concurrency: all methods are safe for concurrent use. Readers take no lock: they load the
// current ring (an atomic pointer). Refresh and AddTenant (serialized by slow) derive markers and
// build the next ring without holding anything a reader needs, then swap it in.
type Keyring struct {
	secret       []byte
	epochLen     time.Duration
	detectWindow time.Duration

	slow sync.Mutex // serializes Refresh and AddTenant (the slow paths)
	cur  atomic.Pointer[ring]
}

// NewKeyring builds a keyring for the given tenants and derives their live markers for the
// current time. epochLen ≤ 0 means 1 h; detectWindow ≤ 0 means 24 h. The secret is copied.
func NewKeyring(secret []byte, epochLen, detectWindow time.Duration, tenants []string) *Keyring {
	if epochLen <= 0 {
		epochLen = time.Hour
	}
	if detectWindow <= 0 {
		detectWindow = 24 * time.Hour
	}
	k := &Keyring{
		secret:       append([]byte(nil), secret...),
		epochLen:     epochLen,
		detectWindow: detectWindow,
	}
	r := &ring{tenantIdx: make(map[string]uint32), base: newWinSet(0), delta: newWinSet(0)}
	for _, t := range tenants {
		if _, ok := r.tenantIdx[t]; !ok {
			r.tenantIdx[t] = uint32(len(r.tenants))
			r.tenants = append(r.tenants, &tenantState{name: t})
		}
	}
	k.cur.Store(r)
	k.Refresh(time.Now())
	return k
}

// ring is the keyring's current state.
func (k *Keyring) ring() *ring { return k.cur.Load() }

// Epoch returns the epoch that contains t.
func (k *Keyring) Epoch(t time.Time) uint64 {
	ns := t.UnixNano()
	if ns < 0 {
		return 0
	}
	return uint64(ns) / uint64(k.epochLen)
}

// EpochLen and DetectWindow report the keyring's configuration (after defaults).
func (k *Keyring) EpochLen() time.Duration     { return k.epochLen }
func (k *Keyring) DetectWindow() time.Duration { return k.detectWindow }

// LiveMarkers returns how many markers are live (for metrics and benchmarks).
func (k *Keyring) LiveMarkers() int { return len(k.ring().recs) }

// Tenants returns the tenants the keyring knows.
func (k *Keyring) Tenants() []string {
	r := k.ring()
	out := make([]string, len(r.tenants))
	for i, t := range r.tenants {
		out[i] = t.name
	}
	return out
}

// AddTenant makes name known and its markers for every live epoch detectable. Adding a known
// tenant does nothing.
func (k *Keyring) AddTenant(name string) {
	k.slow.Lock()
	defer k.slow.Unlock()
	old := k.ring()
	if _, known := old.tenantIdx[name]; known {
		return
	}
	r := &ring{lo: old.lo, hi: old.hi, live: old.live, nbase: old.nbase, base: old.base, recsGen: old.recsGen}
	r.tenants = append(old.tenants[:len(old.tenants):len(old.tenants)], &tenantState{name: name})
	r.tenantIdx = make(map[string]uint32, len(old.tenantIdx)+1)
	for n, i := range old.tenantIdx {
		r.tenantIdx[n] = i
	}
	idx := uint32(len(old.tenants))
	r.tenantIdx[name] = idx
	r.recs = old.recs
	if old.live {
		// Appending writes past old.recs' length only: readers of old never look there.
		r.recs = append(r.recs, k.derive([]string{name}, idx, old.lo, old.hi)...)
	}
	if len(r.recs)-r.nbase > r.nbase/8+1024 {
		r.nbase, r.base, r.delta = len(r.recs), buildWinSet(r.recs, 0, len(r.recs)), newWinSet(0)
	} else {
		r.delta = buildWinSet(r.recs, r.nbase, len(r.recs))
	}
	k.cur.Store(r)
}

// Refresh adds the markers of epochs that became live by now and drops those older than the
// detect window. The gateway calls it from a ticker (at least once per epoch), not on the hot path.
// The next ring is built beside the current one (at 10^6 live markers, about a second and its
// memory twice over for that time) and swapped in.
func (k *Keyring) Refresh(now time.Time) {
	k.slow.Lock()
	defer k.slow.Unlock()
	cur := k.Epoch(now)
	lo := k.Epoch(now.Add(-k.detectWindow))
	hi := cur + 1
	old := k.ring()
	if old.live && old.lo == lo && old.hi == hi {
		return
	}
	names := make([]string, len(old.tenants))
	for i, t := range old.tenants {
		names[i] = t.name
	}
	recs := make([]markerRec, 0, len(names)*int(hi-lo+1))
	for _, m := range old.recs {
		if m.epoch >= lo && m.epoch <= hi {
			recs = append(recs, m)
		}
	}
	for e := lo; e <= hi; e++ {
		if old.live && e >= old.lo && e <= old.hi {
			continue
		}
		recs = append(recs, k.derive(names, 0, e, e)...)
	}
	k.cur.Store(&ring{tenants: old.tenants, tenantIdx: old.tenantIdx, recs: recs, nbase: len(recs),
		base: buildWinSet(recs, 0, len(recs)), delta: newWinSet(0), lo: lo, hi: hi, live: true, recsGen: old.recsGen + 1})
}

// derive computes the markers of names (tenant indexes starting at firstIdx) for epochs lo..hi.
func (k *Keyring) derive(names []string, firstIdx uint32, lo, hi uint64) []markerRec {
	mac := hmac.New(sha256.New, k.secret)
	out := make([]markerRec, 0, len(names)*int(hi-lo+1))
	var m [MarkerLen]byte
	for e := lo; e <= hi; e++ {
		for i, name := range names {
			markerInto(&m, mac, name, e)
			var rec markerRec
			copy(rec.body[:], m[len(MarkerPrefix):])
			rec.tenant = firstIdx + uint32(i)
			rec.epoch = e
			out = append(out, rec)
		}
	}
	return out
}

// eachWindow calls f with every live marker (its index in r.recs) that has a 7-character window
// whose canonical key is key, and the window's offset (the caller checks which way it reads).
// found: the key is a window of some live marker.
func (r *ring) eachWindow(key uint64, f func(rec, off int)) (found bool) {
	g := func(rec, off int) { found = true; f(rec, off) }
	if r.base.mayHave(key) {
		r.base.each(key, g)
	}
	if r.delta.mayHave(key) {
		r.delta.each(key, g)
	}
	return found
}

// hasWindow says whether any live marker has a 7-character window whose canonical key is key.
func (r *ring) hasWindow(key uint64) bool {
	return r.base.mayHave(key) && r.base.has(key) || r.delta.mayHave(key) && r.delta.has(key)
}

// prefixed calls f with every live marker whose body begins with the 8 characters c (lowercase
// base32): the prefix scanner's and Lookup's candidates, found by the window set.
func (r *ring) prefixed(c []byte, f func(m *markerRec)) {
	w := c[:FragmentMin]
	r.eachWindow(setKeyOf(w), func(rec, off int) {
		m := &r.recs[rec]
		if off == 0 && string(m.body[:FragmentMin]) == string(w) {
			f(m)
		}
	})
}

// Current returns tenant's marker for the epoch of now, adding the tenant if it is unknown (so
// every marker ever injected is detectable). If now has run past the live epochs because Refresh
// was not called in time, it refreshes first.
func (k *Keyring) Current(tenant string, now time.Time) (marker string, epoch uint64) {
	epoch = k.Epoch(now)
	r := k.ring()
	if !r.live || epoch > r.hi {
		k.Refresh(now)
		r = k.ring()
	}
	idx, known := r.tenantIdx[tenant]
	if !known {
		k.AddTenant(tenant)
		r = k.ring()
		idx = r.tenantIdx[tenant]
	}
	ts := r.tenants[idx]
	if c := ts.cur.Load(); c != nil && c.epoch == epoch {
		return c.marker, epoch
	}
	marker = Marker(k.secret, tenant, epoch)
	ts.cur.Store(&curMarker{epoch: epoch, marker: marker})
	return marker, epoch
}

// Lookup reports the owner of a complete live marker.
func (k *Keyring) Lookup(marker string) (Owner, bool) {
	if len(marker) != MarkerLen || marker[:len(MarkerPrefix)] != MarkerPrefix {
		return Owner{}, false
	}
	c := marker[len(MarkerPrefix):]
	for i := 0; i < len(c); i++ {
		if b32val[c[i]] < 0 {
			return Owner{}, false
		}
	}
	r := k.ring()
	var o Owner
	found := false
	r.prefixed([]byte(c), func(m *markerRec) {
		if !found && string(m.body[:]) == c {
			o, found = Owner{Tenant: r.tenants[m.tenant].name, Epoch: m.epoch}, true
		}
	})
	return o, found
}

// FindMarkers returns the live complete markers present in text, each once, in order of first
// appearance (nil if none). The gateway runs it on the request prompt: those markers are the
// requester's own echoes, so a reply repeating them is not a leak.
func (k *Keyring) FindMarkers(text string) []string {
	var out []string
	for i := 0; ; {
		j := strings.Index(text[i:], MarkerPrefix)
		if j < 0 {
			return out
		}
		p := i + j
		i = p + len(MarkerPrefix)
		if p+MarkerLen > len(text) {
			continue
		}
		m := text[p : p+MarkerLen]
		if _, ok := k.Lookup(m); !ok {
			continue
		}
		dup := false
		for _, o := range out {
			if o == m {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, m)
		}
		i = p + MarkerLen
	}
}
