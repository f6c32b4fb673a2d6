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

// entry is one live marker, stored by the 40-bit key of its first FragmentMin characters. It holds
// no pointers, so a million of them cost the garbage collector nothing to scan (~40 MB of map).
type entry struct {
	rest   [MarkerChars - FragmentMin]byte // characters 8..19 after "KVG-"
	tenant uint32                          // index into Keyring.tenants
	epoch  uint64
}

type curMarker struct {
	epoch  uint64
	marker string
}

type tenantState struct {
	name string
	cur  atomic.Pointer[curMarker] // cache for Current: one HMAC per tenant per epoch
}

// Keyring derives and recognizes markers. Epoch = unix time / epochLen. A marker is live (known to
// Lookup and the scanners) while its epoch lies within the detect window before now, plus the
// next epoch so that a replica whose clock runs slightly ahead is still recognized. Lookups are one
// map access by the first 8 characters, whatever the number of live markers.
//
// Concurrency: all methods are safe for concurrent use. Lookups take a read lock; Refresh and
// AddTenant derive markers outside the lock and take the write lock only to insert and delete.
type Keyring struct {
	secret       []byte
	epochLen     time.Duration
	detectWindow time.Duration

	slow sync.Mutex // serializes Refresh and AddTenant (the slow paths)

	mu        sync.RWMutex
	tenants   []*tenantState
	tenantIdx map[string]uint32
	byPrefix  map[uint64]entry
	overflow  map[uint64][]entry // further entries whose first 8 characters collide (rare)
	// recs: every live marker, and wins: every HoldMin-character window of their bodies (in
	// classes) → its marker in recs. So the folded detector finds a run from any offset of any
	// live marker, in either direction, with one probe of an open-addressed table. recs keeps
	// markers of dropped epochs until the next rebuild (dead: tenant == deadRec).
	recs []markerRec
	wins winTable
	// recsGen counts rebuilds that moved markers in recs: a detector holding indexes into recs
	// across Feeds drops them when it changes.
	recsGen   uint64
	epochKeys map[uint64][]uint64 // epoch → keys inserted for it, so Refresh can drop it
	lo, hi    uint64              // live epochs, inclusive; valid when live
	live      bool
	count     int
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
		tenantIdx:    make(map[string]uint32),
		byPrefix:     make(map[uint64]entry),
		overflow:     make(map[uint64][]entry),
		wins:         newWinTable(0),
		epochKeys:    make(map[uint64][]uint64),
	}
	k.mu.Lock()
	for _, t := range tenants {
		if _, ok := k.tenantIdx[t]; !ok {
			k.tenantIdx[t] = uint32(len(k.tenants))
			k.tenants = append(k.tenants, &tenantState{name: t})
		}
	}
	k.mu.Unlock()
	k.Refresh(time.Now())
	return k
}

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
func (k *Keyring) LiveMarkers() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.count
}

// Tenants returns the tenants the keyring knows.
func (k *Keyring) Tenants() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]string, len(k.tenants))
	for i, t := range k.tenants {
		out[i] = t.name
	}
	return out
}

// AddTenant makes name known and its markers for every live epoch detectable. Adding a known
// tenant does nothing.
func (k *Keyring) AddTenant(name string) {
	k.slow.Lock()
	defer k.slow.Unlock()
	k.mu.RLock()
	_, known := k.tenantIdx[name]
	lo, hi, live := k.lo, k.hi, k.live
	k.mu.RUnlock()
	if known {
		return
	}
	k.mu.Lock()
	idx := uint32(len(k.tenants))
	k.tenantIdx[name] = idx
	k.tenants = append(k.tenants, &tenantState{name: name})
	k.mu.Unlock()
	if !live {
		return
	}
	ents, keys := k.derive([]string{name}, idx, lo, hi)
	k.mu.Lock()
	k.insertLocked(ents, keys)
	k.mu.Unlock()
}

// Refresh adds the markers of epochs that became live by now and drops those older than the
// detect window. The gateway calls it from a ticker (at least once per epoch), not on the hot path.
func (k *Keyring) Refresh(now time.Time) {
	k.slow.Lock()
	defer k.slow.Unlock()
	cur := k.Epoch(now)
	lo := k.Epoch(now.Add(-k.detectWindow))
	hi := cur + 1

	k.mu.RLock()
	names := make([]string, len(k.tenants))
	for i, t := range k.tenants {
		names[i] = t.name
	}
	olo, ohi, live := k.lo, k.hi, k.live
	k.mu.RUnlock()

	// Derive every epoch in [lo, hi] not already present, outside the lock.
	var ents []entry
	var keys []uint64
	for e := lo; e <= hi; e++ {
		if live && e >= olo && e <= ohi {
			continue
		}
		en, ke := k.derive(names, 0, e, e)
		ents = append(ents, en...)
		keys = append(keys, ke...)
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	k.insertLocked(ents, keys)
	if live {
		dropped := false
		for e := olo; e <= ohi; e++ {
			if e < lo || e > hi {
				k.dropEpochLocked(e)
				dropped = true
			}
		}
		if dropped {
			k.rebuildWindowsLocked()
		}
	}
	k.lo, k.hi, k.live = lo, hi, true
}

// derive computes the markers of names (tenant indexes starting at firstIdx) for epochs lo..hi.
func (k *Keyring) derive(names []string, firstIdx uint32, lo, hi uint64) ([]entry, []uint64) {
	mac := hmac.New(sha256.New, k.secret)
	n := len(names) * int(hi-lo+1)
	ents := make([]entry, 0, n)
	keys := make([]uint64, 0, n)
	var m [MarkerLen]byte
	for e := lo; e <= hi; e++ {
		for i, name := range names {
			markerInto(&m, mac, name, e)
			c := m[len(MarkerPrefix):]
			var en entry
			copy(en.rest[:], c[FragmentMin:])
			en.tenant = firstIdx + uint32(i)
			en.epoch = e
			ents = append(ents, en)
			keys = append(keys, prefixKey(c))
		}
	}
	return ents, keys
}

func (k *Keyring) insertLocked(ents []entry, keys []uint64) {
	for i, en := range ents {
		key := keys[i]
		if _, taken := k.byPrefix[key]; taken {
			k.overflow[key] = append(k.overflow[key], en)
		} else {
			k.byPrefix[key] = en
		}
		k.epochKeys[en.epoch] = append(k.epochKeys[en.epoch], key)
		k.count++
		rec := markerRec{body: entryBody(key, &en), tenant: en.tenant, epoch: en.epoch}
		k.recs = append(k.recs, rec)
		if 2*len(k.recs)*windowsPerRec <= len(k.wins.slots) {
			k.wins.insertRec(&k.recs[len(k.recs)-1], len(k.recs)-1)
		}
	}
	if 2*len(k.recs)*windowsPerRec > len(k.wins.slots) {
		k.rebuildWindowsLocked()
	}
}

// deadRec marks a markerRec of a dropped epoch.
const deadRec = ^uint32(0)

// rebuildWindowsLocked drops dead markers from recs and builds the window table anew.
func (k *Keyring) rebuildWindowsLocked() {
	live := k.recs[:0]
	for _, r := range k.recs {
		if r.tenant != deadRec {
			live = append(live, r)
		}
	}
	clear(k.recs[len(live):])
	k.recs = live
	k.recsGen++
	k.wins = buildWindows(k.recs)
}

// entryBody rebuilds the 20 characters of the marker stored as en under prefix key key.
func entryBody(key uint64, en *entry) (body [MarkerChars]byte) {
	for i := FragmentMin - 1; i >= 0; i-- {
		body[i] = b32alphabet[key&31]
		key >>= 5
	}
	copy(body[FragmentMin:], en.rest[:])
	return body
}

func (k *Keyring) dropEpochLocked(e uint64) {
	for _, key := range k.epochKeys[e] {
		ov := k.overflow[key]
		kept := ov[:0]
		for _, en := range ov {
			if en.epoch != e {
				kept = append(kept, en)
			} else {
				k.count--
			}
		}
		if main, ok := k.byPrefix[key]; ok && main.epoch == e {
			k.count--
			if len(kept) > 0 {
				k.byPrefix[key] = kept[0]
				kept = kept[1:]
			} else {
				delete(k.byPrefix, key)
			}
		}
		if len(kept) == 0 {
			delete(k.overflow, key)
		} else {
			k.overflow[key] = kept
		}
	}
	delete(k.epochKeys, e)
	for i := range k.recs {
		if k.recs[i].epoch == e {
			k.recs[i].tenant = deadRec
		}
	}
}

// Current returns tenant's marker for the epoch of now, adding the tenant if it is unknown (so
// every marker ever injected is detectable). If now has run past the live epochs because Refresh
// was not called in time, it refreshes first.
func (k *Keyring) Current(tenant string, now time.Time) (marker string, epoch uint64) {
	epoch = k.Epoch(now)
	k.mu.RLock()
	idx, known := k.tenantIdx[tenant]
	stale := !k.live || epoch > k.hi
	var ts *tenantState
	if known {
		ts = k.tenants[idx]
	}
	k.mu.RUnlock()
	if stale {
		k.Refresh(now)
	}
	if !known {
		k.AddTenant(tenant)
		k.mu.RLock()
		ts = k.tenants[k.tenantIdx[tenant]]
		k.mu.RUnlock()
	}
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
	var key uint64
	for i := 0; i < FragmentMin; i++ {
		key = key<<5 | uint64(b32val[c[i]])
	}
	rest := c[FragmentMin:]
	k.mu.RLock()
	defer k.mu.RUnlock()
	if en, ok := k.byPrefix[key]; ok {
		if string(en.rest[:]) == rest {
			return Owner{Tenant: k.tenants[en.tenant].name, Epoch: en.epoch}, true
		}
		for _, en := range k.overflow[key] {
			if string(en.rest[:]) == rest {
				return Owner{Tenant: k.tenants[en.tenant].name, Epoch: en.epoch}, true
			}
		}
	}
	return Owner{}, false
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
