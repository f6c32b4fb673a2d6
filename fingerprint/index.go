package fingerprint

import (
	"slices"
	"sync"
	"time"
)

// BytesPerFingerprint is what one kept fingerprint costs the Index on the heap (its map slot
// with one owner, and its place in the record that evicts it), as BenchmarkIndexMemory measured
// it (heapB/fingerprint, 111); the memory cap is accounted with it. A Go map grows by doubling,
// so the heap of a given index may be somewhat below or above this.
const BytesPerFingerprint = 112

// recordOverhead is what one recorded prompt costs besides its fingerprints.
const recordOverhead = 64

// Config bounds an Index and says what a leak is.
type Config struct {
	// MaxBytes caps the index; the oldest prompts are forgotten first.
	MaxBytes int64
	// TTL: prompts older than this are forgotten (the canary's detect window).
	TTL time.Duration
	// CutMatches distinct foreign fingerprints in one reply are a leak.
	CutMatches int
	// CommonTenants: a fingerprint that this many distinct tenants sent is boilerplate, never
	// evidence.
	CommonTenants int
}

// owner is one tenant that sent a fingerprint: how many of its kept prompts hold it and the
// backends (bits) they went to.
type owner struct {
	tenant uint32
	refs   uint32
	mask   uint64
}

// entry is one fingerprint's owners: the first inline (most fingerprints have one), the rest
// behind a pointer. Once CommonTenants tenants sent it, it is common until every prompt holding
// it was forgotten, and further owners are not tracked.
type entry struct {
	first  owner
	more   *[]owner
	refs   uint32 // recorded prompts holding it, tracked owners or not
	common bool
}

func (e *entry) distinct() int {
	n := 0
	if e.first.refs > 0 {
		n = 1
	}
	if e.more != nil {
		n += len(*e.more)
	}
	return n
}

// record is one kept prompt, in arrival order.
type record struct {
	at     time.Time
	tenant uint32
	mask   uint64
	fps    []uint64
	cost   int64
}

// Index holds the fingerprints of recent prompts of one replica, per tenant and backend. Safe
// for concurrent use.
type Index struct {
	h   *Hasher
	cfg Config

	mu       sync.RWMutex
	entries  map[uint64]entry
	records  []record // oldest first, from head
	head     int
	used     int64
	tenantID map[string]uint32
	names    []string          // by id−1
	backend  map[string]uint64 // a bit per backend; names past 63 share the last bit
	evicted  uint64
}

// NewIndex is an empty index; cfg's zero fields get the defaults of DefaultConfig.
func NewIndex(h *Hasher, cfg Config) *Index {
	d := DefaultConfig()
	orDefault(&cfg.MaxBytes, d.MaxBytes)
	orDefault(&cfg.TTL, d.TTL)
	orDefault(&cfg.CutMatches, d.CutMatches)
	orDefault(&cfg.CommonTenants, d.CommonTenants)
	return &Index{h: h, cfg: cfg, entries: map[uint64]entry{}, tenantID: map[string]uint32{}, backend: map[string]uint64{}}
}

// DefaultConfig: 64 MiB, 24 h, 3 matches cut, 3 tenants make boilerplate (see DESIGN.md,
// "Prompt fingerprints", for the measurements behind them).
func DefaultConfig() Config {
	return Config{MaxBytes: 64 << 20, TTL: 24 * time.Hour, CutMatches: 3, CommonTenants: 3}
}

// Hasher is the index's hasher.
func (ix *Index) Hasher() *Hasher { return ix.h }

// Config is the index's configuration with defaults applied.
func (ix *Index) Config() Config { return ix.cfg }

func (ix *Index) tenant(name string) uint32 {
	id, ok := ix.tenantID[name]
	if !ok {
		id = uint32(len(ix.tenantID)) + 1
		ix.tenantID[name] = id
		ix.names = append(ix.names, name)
	}
	return id
}

func (ix *Index) mask(backends []string) uint64 {
	var m uint64
	for _, b := range backends {
		bit, ok := ix.backend[b]
		if !ok {
			bit = uint64(1) << min(len(ix.backend), 63)
			ix.backend[b] = bit
		}
		m |= bit
	}
	return m
}

func (ix *Index) nameOf(id uint32) string {
	if id == 0 || int(id) > len(ix.names) {
		return ""
	}
	return ix.names[id-1]
}

// Record keeps the fingerprints fps of a prompt that tenant sent to backends, at now. It takes
// ownership of fps. A prompt too large for the whole cap keeps its first fingerprints.
func (ix *Index) Record(tenant string, backends []string, fps []uint64, now time.Time) {
	slices.Sort(fps)
	fps = slices.Compact(fps)
	if limit := (ix.cfg.MaxBytes - recordOverhead) / BytesPerFingerprint; int64(len(fps)) > limit {
		fps = fps[:max(limit, 0)]
	}
	fps = slices.Clip(fps)
	cost := int64(len(fps))*BytesPerFingerprint + recordOverhead
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.prune(now, cost)
	rec := record{at: now, tenant: ix.tenant(tenant), mask: ix.mask(backends), fps: fps, cost: cost}
	for _, fp := range fps {
		e := ix.entries[fp]
		e.refs++
		switch {
		case e.first.refs > 0 && e.first.tenant == rec.tenant:
			e.first.refs++
			e.first.mask |= rec.mask
		case e.first.refs == 0 && e.more == nil:
			e.first = owner{tenant: rec.tenant, refs: 1, mask: rec.mask}
		default:
			found := false
			if e.more != nil {
				for i := range *e.more {
					if o := &(*e.more)[i]; o.tenant == rec.tenant {
						o.refs++
						o.mask |= rec.mask
						found = true
						break
					}
				}
			}
			if !found && !e.common {
				if e.first.refs == 0 {
					e.first = owner{tenant: rec.tenant, refs: 1, mask: rec.mask}
				} else {
					if e.more == nil {
						e.more = new([]owner)
					}
					*e.more = append(*e.more, owner{tenant: rec.tenant, refs: 1, mask: rec.mask})
				}
			}
			if e.distinct() >= ix.cfg.CommonTenants {
				e.common = true
			}
		}
		ix.entries[fp] = e
	}
	ix.records = append(ix.records, rec)
	ix.used += cost
}

// prune forgets the oldest prompts while the index would exceed its cap with room more bytes,
// or they are older than the TTL. Called with mu held.
func (ix *Index) prune(now time.Time, room int64) {
	for ix.head < len(ix.records) {
		r := &ix.records[ix.head]
		if ix.used+room <= ix.cfg.MaxBytes && now.Sub(r.at) <= ix.cfg.TTL {
			break
		}
		ix.forget(r)
		*r = record{}
		ix.head++
	}
	if ix.head > 64 && ix.head*2 > len(ix.records) {
		n := copy(ix.records, ix.records[ix.head:])
		clear(ix.records[n:])
		ix.records, ix.head = ix.records[:n], 0
	}
}

func (ix *Index) forget(r *record) {
	ix.used -= r.cost
	ix.evicted++
	for _, fp := range r.fps {
		e, ok := ix.entries[fp]
		if !ok {
			continue
		}
		if e.refs--; e.refs == 0 {
			delete(ix.entries, fp)
			continue
		}
		if e.first.refs > 0 && e.first.tenant == r.tenant {
			if e.first.refs--; e.first.refs == 0 {
				e.first = owner{}
				if e.more != nil && len(*e.more) > 0 {
					e.first = (*e.more)[0]
					*e.more = (*e.more)[1:]
				}
			}
		} else if e.more != nil {
			for i := range *e.more {
				if o := &(*e.more)[i]; o.tenant == r.tenant {
					if o.refs--; o.refs == 0 {
						*e.more = slices.Delete(*e.more, i, i+1)
					}
					break
				}
			}
		}
		if e.more != nil && len(*e.more) == 0 {
			e.more = nil
		}
		ix.entries[fp] = e
	}
}

// Prune forgets what is past the TTL at now (Record prunes too; this is for an idle replica).
func (ix *Index) Prune(now time.Time) {
	ix.mu.Lock()
	ix.prune(now, 0)
	ix.mu.Unlock()
}

// Stats is the index's size: accounted bytes, fingerprints, prompts kept, prompts forgotten.
type Stats struct {
	Bytes        int64
	Fingerprints int
	Prompts      int
	Evicted      uint64
}

// Stats reads the index's size now.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return Stats{Bytes: ix.used, Fingerprints: len(ix.entries), Prompts: len(ix.records) - ix.head, Evicted: ix.evicted}
}

// The Index as a Scanner's source: one read lock over a batch of lookups.
func (ix *Index) hasher() *Hasher       { return ix.h }
func (ix *Index) cutMatches() int       { return ix.cfg.CutMatches }
func (ix *Index) rlock()                { ix.mu.RLock() }
func (ix *Index) runlock()              { ix.mu.RUnlock() }
func (ix *Index) name(id uint32) string { return ix.nameOf(id) }
func (ix *Index) verdict(fp uint64, requester uint32, p *path) (verdict, uint32) {
	return ix.lookup(fp, requester, p.mask)
}

// verdict of one fingerprint for one reply.
type verdict uint8

const (
	unknown verdict = iota // no recent prompt holds it
	common                 // boilerplate
	ownText                // the requester sent it too
	offPath                // only prompts sent to backends off the reply's path hold it
	foreign                // another tenant's prompt on the path: evidence
)

// lookup judges fp for a reply to requester over backends mask; called with mu read-held.
func (ix *Index) lookup(fp uint64, requester uint32, mask uint64) (verdict, uint32) {
	e, ok := ix.entries[fp]
	if !ok {
		return unknown, 0
	}
	if e.common {
		return common, 0
	}
	victim := uint32(0)
	check := func(o owner) bool {
		if o.tenant == requester {
			return true
		}
		if victim == 0 && o.mask&mask != 0 {
			victim = o.tenant
		}
		return false
	}
	if e.first.refs > 0 && check(e.first) {
		return ownText, 0
	}
	if e.more != nil {
		for _, o := range *e.more {
			if check(o) {
				return ownText, 0
			}
		}
	}
	if victim == 0 {
		return offPath, 0
	}
	return foreign, victim
}
