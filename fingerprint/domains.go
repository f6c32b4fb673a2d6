package fingerprint

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Domains is the index partitioned by KV domain: a leaked prompt can only come out of the KV
// cache of an engine that served it, and that cache holds at most its pool, so each partition
// (an engine by default, see Keying) keeps the fingerprints of about PoolFactor × its pool's
// tokens of distinct prompt text, the detect window as the age bound, and one partition's
// traffic never evicts another's. A prompt is recorded in the partitions of its route; a reply
// is checked against its route's partitions with the Index's verdict rule (common text, then
// the requester's own, then another tenant's text on the path).
//
// Retention is by generations: a partition fills its current generation up to
// budget/(generations−1) fingerprints (or TTL/generations of time), then opens the next and
// drops the oldest once generations are live; an entry is live while its generation is, and a
// prompt sent again moves its entries to the current generation instead of adding copies. So
// the fingerprints touched last, budget of them at least, are always kept; nothing is sorted
// and an eviction is one counter update, the dead entries being reclaimed when their table
// shard is rebuilt.
//
// Safe for concurrent use: writers (Record, Apply, SetPool, Prune) share one lock; the scan
// path takes none (see table.go).
type Domains struct {
	h   *Hasher
	cfg DomainsConfig

	shards [shardCount]shard

	wmu   sync.Mutex
	parts atomic.Pointer[[]*partition] // by id, copied on write

	nmu      sync.RWMutex
	partID   map[string]uint16
	tenantID map[string]uint32
	names    []string // by id−1

	scannedIncomplete atomic.Uint64
}

// FingerprintsPerToken is how many fingerprints a prompt keeps per token, measured: 0.096 per
// byte of prose and code at about 4 bytes per token (fingerprints-at-scale.md).
const FingerprintsPerToken = 0.384

// retentionSlack widens a partition's budget over the mean rate, for the spread of the sample
// rate between texts (English keeps more fingerprints per token than code).
const retentionSlack = 1.25

// generations live per partition; a power of two (entries keep generation numbers modulo 2^24).
const generations = 8

// Reserved partitions: 0 holds the shipped and operator's public text (never evicted), 1 the
// markers of fingerprints that CommonTenants tenants sent.
const (
	boilerplatePart = 0
	commonPart      = 1
	firstDomainPart = 2
)

// DomainsConfig bounds the Domains and says what a leak is.
type DomainsConfig struct {
	// TTL: fingerprints not sent again for this long are forgotten (the detect window).
	TTL time.Duration
	// CutMatches distinct foreign fingerprints in one reply are a leak.
	CutMatches int
	// CommonTenants: a fingerprint that this many distinct tenants sent is common text.
	CommonTenants int
	// PoolFactor: each partition keeps this many of its pool's tokens of distinct text (2).
	PoolFactor float64
	// DefaultPoolTokens is the pool of a domain whose pool is not known yet (SetPool).
	DefaultPoolTokens int64
	// CommonFingerprints bounds the markers of common text (fingerprints CommonTenants
	// tenants sent), the detect window as their age bound too.
	CommonFingerprints int64
	// PublicText is the operator's public text (LoadPublicDir), common like the shipped set.
	PublicText []string
	// NoShippedPublicText leaves the shipped public text (PublicTexts) out.
	NoShippedPublicText bool
}

// DefaultDomainsConfig: Config's verdict defaults, 2 pools, a 1 M-token pool until polled,
// 1 M common fingerprints.
func DefaultDomainsConfig() DomainsConfig {
	d := DefaultConfig()
	return DomainsConfig{TTL: d.TTL, CutMatches: d.CutMatches, CommonTenants: d.CommonTenants,
		PoolFactor: 2, DefaultPoolTokens: 1 << 20, CommonFingerprints: 1 << 20}
}

// Keying says what a KV domain is: engines that share a cache tier share a partition.
type Keying string

// Keyings.
const (
	ByEngine Keying = "engine"
	ByGroup  Keying = "group"
	ByModel  Keying = "model"
)

// ParseKeying reads the configured keying ("" is engine); field names the configuration field
// for the error.
func ParseKeying(field, s string) (Keying, error) {
	switch k := Keying(s); k {
	case "":
		return ByEngine, nil
	case ByEngine, ByGroup, ByModel:
		return k, nil
	}
	return "", fmt.Errorf("%s: %q is not one of engine, group, model", field, s)
}

// Domain is the partition of an engine with this name, group and model (an engine without a
// group or model is a domain of its own).
func (k Keying) Domain(engine, group, model string) string {
	switch {
	case k == ByGroup && group != "":
		return "group:" + group
	case k == ByModel && model != "":
		return "model:" + model
	}
	return engine
}

// Incomplete says why a partition may lack text other replicas recorded.
type Incomplete uint32

// Reasons.
const (
	Bootstrapping Incomplete = 1 << iota // its stream not read to the end yet
	Gapped                               // records trimmed from its stream before they were read
	Stale                                // its stream not read for too long
)

type generation struct {
	count          int64
	oldest, newest int64 // unix nanoseconds
}

type partition struct {
	name   string
	id     uint16
	pinned bool
	// span is the oldest live generation << 32 | the current one (full counters; entries keep
	// 24 bits of it), read by the scan path.
	span       atomic.Uint64
	incomplete atomic.Uint32

	// write lock:
	budget       int64
	gens         [generations]generation
	oldest, cur  uint32
	total        int64
	evicted      uint64
	evictedYoung atomic.Uint64
}

func (p *partition) alive(g uint32) bool {
	if p.pinned {
		return true
	}
	s := p.span.Load()
	oldest, cur := uint32(s>>32), uint32(s)
	return (cur-g)&genMask <= cur-oldest
}

func (p *partition) publishSpan() { p.span.Store(uint64(p.oldest)<<32 | uint64(p.cur)) }

// orDefault sets *v to def unless it is positive.
func orDefault[T int | int64 | float64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// NewDomains is an empty partitioned index; cfg's zero fields get DefaultDomainsConfig's.
func NewDomains(h *Hasher, cfg DomainsConfig) *Domains {
	def := DefaultDomainsConfig()
	orDefault(&cfg.TTL, def.TTL)
	orDefault(&cfg.CutMatches, def.CutMatches)
	orDefault(&cfg.CommonTenants, def.CommonTenants)
	orDefault(&cfg.PoolFactor, def.PoolFactor)
	orDefault(&cfg.DefaultPoolTokens, def.DefaultPoolTokens)
	orDefault(&cfg.CommonFingerprints, def.CommonFingerprints)
	d := &Domains{h: h, cfg: cfg, partID: map[string]uint16{}, tenantID: map[string]uint32{}}
	for i := range d.shards {
		d.shards[i].tab.Store(newSlots(minBuckets))
	}
	parts := []*partition{
		{name: "(public text)", id: boilerplatePart, pinned: true},
		{name: "(common text)", id: commonPart, budget: cfg.CommonFingerprints},
	}
	d.parts.Store(&parts)
	if !cfg.NoShippedPublicText {
		for _, t := range PublicTexts() {
			d.AddPublic(t)
		}
	}
	d.AddPublic(cfg.PublicText...)
	return d
}

// Hasher is the index's hasher.
func (d *Domains) Hasher() *Hasher { return d.h }

// Config is the configuration with defaults applied.
func (d *Domains) Config() DomainsConfig { return d.cfg }

// Budget is the fingerprints a partition over a pool of poolTokens keeps.
func (d *Domains) Budget(poolTokens int64) int64 {
	return int64(math.Ceil(float64(poolTokens) * d.cfg.PoolFactor * FingerprintsPerToken * retentionSlack))
}

// SetPool sizes domain's partition for a KV pool of poolTokens (the engine's
// max_total_num_tokens; for a group, its members' together). A smaller budget takes effect as
// the partition's generations turn over.
func (d *Domains) SetPool(domain string, poolTokens int64) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.partition(domain).budget = d.Budget(poolTokens)
}

// SetIncomplete records why domain's partition may lack other replicas' text (0: it does not).
func (d *Domains) SetIncomplete(domain string, why Incomplete) {
	d.wmu.Lock()
	p := d.partition(domain)
	d.wmu.Unlock()
	p.incomplete.Store(uint32(why))
}

// partition is domain's, created with the default pool; write lock held.
func (d *Domains) partition(domain string) *partition {
	d.nmu.RLock()
	id, ok := d.partID[domain]
	d.nmu.RUnlock()
	parts := *d.parts.Load()
	if ok {
		return parts[id]
	}
	if len(parts) >= maxPartitions {
		return parts[len(parts)-1] // past 65534 domains the last ones share a partition
	}
	p := &partition{name: domain, id: uint16(len(parts)), budget: d.Budget(d.cfg.DefaultPoolTokens)}
	next := append(parts[:len(parts):len(parts)], p)
	d.parts.Store(&next)
	d.nmu.Lock()
	d.partID[domain] = p.id
	d.nmu.Unlock()
	return p
}

// tenant is name's id, registered on first sight.
func (d *Domains) tenant(name string) uint32 {
	d.nmu.RLock()
	id, ok := d.tenantID[name]
	d.nmu.RUnlock()
	if ok {
		return id
	}
	d.nmu.Lock()
	defer d.nmu.Unlock()
	if id, ok = d.tenantID[name]; !ok {
		id = uint32(min(len(d.names)+1, maxTenantID)) // past 16 M tenants the last ones share an id
		d.tenantID[name] = id
		if int(id) > len(d.names) {
			d.names = append(d.names, name)
		}
	}
	return id
}

// Record keeps the fingerprints fps of a prompt that tenant sent over the domains of its
// route, at now, and returns per domain the fingerprints to publish to it: those new to the
// partition here, and those whose entry was old enough that a peer may drop it soon. fps is
// not kept; duplicates in it cost one refresh each.
func (d *Domains) Record(tenant string, domains []string, fps []uint64, now time.Time) [][]uint64 {
	return d.record(tenant, domains, fps, now, true)
}

// Apply keeps a record read from domain's stream (another replica's prompt, or this one's read
// back), at the time it was recorded.
func (d *Domains) Apply(tenant, domain string, fps []uint64, at time.Time) {
	d.record(tenant, []string{domain}, fps, at, false)
}

func (d *Domains) record(tenant string, domains []string, fps []uint64, now time.Time, collect bool) [][]uint64 {
	tid := d.tenant(tenant)
	var fresh [][]uint64
	if collect {
		fresh = make([][]uint64, len(domains))
	}
	d.wmu.Lock()
	defer d.wmu.Unlock()
	t := now.UnixNano()
	for i, domain := range domains {
		p := d.partition(domain)
		d.prune(p, t)
		for k := 0; k < len(fps); k += touchBatch {
			batch := fps[k:min(k+touchBatch, len(fps))]
			d.touch(batch)
			for _, fp := range batch {
				if d.insert(p, key(fp), tid, t) && collect {
					fresh[i] = append(fresh[i], fp)
				}
			}
		}
	}
	return fresh
}

// touchBatch fingerprints have their home buckets read together before they are inserted: the
// reads miss the cache independently, so their latencies overlap (Go has no prefetch), where
// inserting one by one would wait out each miss in turn.
const touchBatch = 32

var touchSink atomic.Uint64

func (d *Domains) touch(fps []uint64) {
	var sum uint64
	for _, fp := range fps {
		fp = key(fp)
		tab := *d.shards[fp&(shardCount-1)].tab.Load()
		sum += tab[home(fp, len(tab)/bucketWords)*bucketWords].Load()
	}
	if sum == 1 {
		touchSink.Add(1) // keeps the reads
	}
}

// Prune forgets what is past the TTL at now in every partition (Record prunes the partitions
// it writes; this is for idle ones).
func (d *Domains) Prune(now time.Time) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	for _, p := range *d.parts.Load() {
		d.prune(p, now.UnixNano())
	}
}

// prune drops p's generations whose newest entry is past the TTL at t. Write lock held.
func (d *Domains) prune(p *partition, t int64) {
	if p.pinned {
		return
	}
	cutoff := t - int64(d.cfg.TTL)
	for {
		o := &p.gens[p.oldest%generations]
		if o.count > 0 && o.newest >= cutoff {
			return
		}
		if p.oldest == p.cur {
			if o.count == 0 {
				return
			}
			d.advance(p, t) // the current generation expired whole: open a new one, drop it
			continue
		}
		d.drop(p, t)
	}
}

// advance opens p's next generation, dropping the oldest when generations are live or the
// partition is over its budget. Write lock held.
func (d *Domains) advance(p *partition, t int64) {
	for p.cur-p.oldest+1 >= generations || (p.total > p.budget && p.oldest < p.cur) {
		d.drop(p, t)
	}
	p.cur++
	p.gens[p.cur%generations] = generation{}
	p.publishSpan()
}

func (d *Domains) drop(p *partition, t int64) {
	g := &p.gens[p.oldest%generations]
	p.total -= g.count
	p.evicted += uint64(g.count)
	if g.count > 0 && g.newest >= t-int64(d.cfg.TTL) {
		p.evictedYoung.Add(uint64(g.count))
	}
	*g = generation{}
	p.oldest++
	p.publishSpan()
}

// ready makes room in p's current generation for one more entry at t.
func (d *Domains) ready(p *partition, t int64) {
	g := &p.gens[p.cur%generations]
	if g.count > 0 && (g.count >= max(1, p.budget/(generations-1)) || t-g.oldest > int64(d.cfg.TTL)/generations) {
		d.advance(p, t)
	}
}

// count adds n entries at t to p's generation gen.
func (p *partition) count(gen uint32, n int64, t int64) {
	g := &p.gens[gen%generations]
	g.count += n
	p.total += n
	if n >= 0 {
		if g.oldest == 0 || t < g.oldest {
			g.oldest = t
		}
		g.newest = max(g.newest, t)
	}
}

// maxOwners bounds the tenants a lookup tells apart (CommonTenants is small).
const maxOwners = 16

// owners is the distinct tenants seen on one fingerprint's entries.
type owners struct {
	ids [maxOwners]uint32
	n   int
}

func (o *owners) add(t uint32) {
	for i := 0; i < o.n; i++ {
		if o.ids[i] == t {
			return
		}
	}
	if o.n < maxOwners {
		o.ids[o.n] = t
		o.n++
	}
}

// liveness is a snapshot of every partition's live generations, for a rebuild: one slice
// lookup per entry. Write lock held.
func (d *Domains) liveness() func(meta uint64) bool {
	parts := *d.parts.Load()
	spans := make([]struct{ oldest, cur uint32 }, len(parts))
	for i, p := range parts {
		spans[i].oldest, spans[i].cur = p.oldest, p.cur
		if p.pinned {
			spans[i].oldest, spans[i].cur = 0, genMask // every generation number is live
		}
	}
	return func(m uint64) bool {
		s := spans[metaPart(m)]
		return metaTenant(m) != tombstone && (s.cur-metaGen(m))&genMask <= s.cur-s.oldest
	}
}

// insert records fp for tenant tid in p at t and says whether to publish it. Write lock held.
func (d *Domains) insert(p *partition, fp uint64, tid uint32, t int64) bool {
	sh := &d.shards[fp&(shardCount-1)]
	if sh.full() {
		sh.rebuild(d.liveness())
	}
	tab := *sh.tab.Load()
	parts := *d.parts.Load()
	buckets := len(tab) / bucketWords
	free, match, marker := -1, -1, -1
	var who owners
	for b := home(fp, buckets); ; b = (b + 1) % buckets {
		end := false
		for j := b * bucketWords; j < (b+1)*bucketWords; j += 2 {
			f := tab[j].Load()
			if f == 0 {
				if free < 0 {
					free = j
				}
				end = true
				break
			}
			if f != fp && free >= 0 {
				continue
			}
			m := tab[j+1].Load()
			tn := metaTenant(m)
			if tn == tombstone || !parts[metaPart(m)].alive(metaGen(m)) {
				if free < 0 {
					free = j
				}
				continue
			}
			switch {
			case f != fp:
			case tn == commonTenant:
				marker = j
			default:
				who.add(tn)
				if tn == tid && metaPart(m) == p.id {
					match = j
				}
			}
		}
		if end {
			break
		}
	}
	switch {
	case marker >= 0: // common text: keep the marker young, not the tenant
		return d.refresh(sh, tab, marker, parts[commonPart], t)
	case match >= 0:
		return d.refresh(sh, tab, match, p, t)
	}
	who.add(tid)
	if who.n >= d.cfg.CommonTenants {
		d.makeCommon(sh, tab, fp, free, parts, t)
		return true
	}
	d.ready(p, t)
	sh.begin()
	if tab[free].Load() == 0 {
		sh.used++
	}
	set(tab, free, fp, packMeta(tid, p.id, p.cur))
	sh.end()
	p.count(p.cur, 1, t)
	return true
}

// refresh moves the live entry at slot j (of partition p) to p's current generation; it says
// whether the entry was in the older half of the live generations (a peer may drop it soon:
// publish it again).
func (d *Domains) refresh(sh *shard, tab []atomic.Uint64, j int, p *partition, t int64) bool {
	d.ready(p, t)
	m := tab[j+1].Load()
	g := metaGen(m)
	alive, age := p.alive(g), (p.cur-g)&genMask // ready may have dropped its generation
	if alive && age == 0 {
		p.count(p.cur, 0, t)
		return false
	}
	if alive {
		p.count(g, -1, t)
	}
	sh.begin()
	tab[j+1].Store(m&^genMask | uint64(p.cur&genMask))
	sh.end()
	p.count(p.cur, 1, t)
	return !alive || age >= generations/2
}

// makeCommon turns fp into common text: its tenants' entries go, one marker stays in the
// common partition.
func (d *Domains) makeCommon(sh *shard, tab []atomic.Uint64, fp uint64, free int, parts []*partition, t int64) {
	cp := parts[commonPart]
	d.ready(cp, t)
	buckets := len(tab) / bucketWords
	sh.begin()
	defer sh.end()
	for b := home(fp, buckets); ; b = (b + 1) % buckets {
		end := false
		for j := b * bucketWords; j < (b+1)*bucketWords; j += 2 {
			f := tab[j].Load()
			if f == 0 {
				end = true
				break
			}
			m := tab[j+1].Load()
			if f != fp || metaTenant(m) == tombstone {
				continue
			}
			if p := parts[metaPart(m)]; p.alive(metaGen(m)) {
				p.count(metaGen(m), -1, t)
			}
			tab[j+1].Store(packMeta(tombstone, 0, 0))
		}
		if end {
			break
		}
	}
	if tab[free].Load() == 0 {
		sh.used++
	}
	set(tab, free, fp, packMeta(commonTenant, commonPart, cp.cur))
	cp.count(cp.cur, 1, t)
}

// insertPinned adds fp as public text (never evicted) unless it is already.
func (d *Domains) insertPinned(sh *shard, fp uint64) bool {
	tab := *sh.tab.Load()
	buckets := len(tab) / bucketWords
	for b := home(fp, buckets); ; b = (b + 1) % buckets {
		for j := b * bucketWords; j < (b+1)*bucketWords; j += 2 {
			f := tab[j].Load()
			if f == fp && tab[j+1].Load() == packMeta(commonTenant, boilerplatePart, 0) {
				return false
			}
			if f == 0 {
				sh.begin()
				set(tab, j, fp, packMeta(commonTenant, boilerplatePart, 0))
				sh.end()
				sh.used++
				return true
			}
		}
	}
}

// The Domains as a Scanner's source: no lock, each lookup reads its shard consistently.
func (d *Domains) hasher() *Hasher { return d.h }
func (d *Domains) cutMatches() int { return d.cfg.CutMatches }
func (d *Domains) rlock()          {}
func (d *Domains) runlock()        {}

func (d *Domains) name(id uint32) string {
	d.nmu.RLock()
	defer d.nmu.RUnlock()
	if id == 0 || int(id) > len(d.names) {
		return ""
	}
	return d.names[id-1]
}

// verdict judges fp for a reply to requester over the partitions of p: every entry of fp is in
// one probe sequence of one shard.
func (d *Domains) verdict(fp uint64, requester uint32, p *path) (vd verdict, victim uint32) {
	fp = key(fp)
	parts := *d.parts.Load()
	sh := &d.shards[fp&(shardCount-1)]
	for spins := 0; ; spins++ { // the shard's seqlock (table.go), inline: no closure per lookup
		s1 := sh.seq.Load()
		if s1&1 == 0 {
			vd, victim = d.judge(*sh.tab.Load(), parts, fp, requester, p)
			if sh.seq.Load() == s1 {
				return vd, victim
			}
		}
		if spins > 64 {
			runtime.Gosched()
		}
	}
}

func (d *Domains) judge(tab []atomic.Uint64, parts []*partition, fp uint64, requester uint32, p *path) (verdict, uint32) {
	buckets := len(tab) / bucketWords
	var who owners
	own, seen := false, false
	victim := uint32(0)
	for b := home(fp, buckets); ; b = (b + 1) % buckets {
		for j := b * bucketWords; j < (b+1)*bucketWords; j += 2 {
			f := tab[j].Load()
			if f == 0 {
				goto done
			}
			if f != fp {
				continue
			}
			m := tab[j+1].Load()
			tn, part := metaTenant(m), metaPart(m)
			if tn == tombstone || int(part) >= len(parts) || !parts[part].alive(metaGen(m)) {
				continue
			}
			if tn == commonTenant {
				return common, 0
			}
			seen = true
			who.add(tn)
			if tn == requester {
				own = true
			} else if victim == 0 && onPath(p.parts, part) {
				victim = tn
			}
		}
	}
done:
	switch {
	case !seen:
		return unknown, 0
	case who.n >= d.cfg.CommonTenants:
		return common, 0
	case own:
		return ownText, 0
	case victim == 0:
		return offPath, 0
	}
	return foreign, victim
}

func onPath(parts []uint16, part uint16) bool {
	for _, q := range parts {
		if q == part {
			return true
		}
	}
	return false
}

// NewScanner scans a reply to requester served over the given domains (its route's), whose own
// prompt is own (nil: none readable). A reply whose route has an incomplete partition is
// counted (DomainsStats.ScannedIncomplete).
func (d *Domains) NewScanner(requester string, domains []string, own *Own) *Scanner {
	id := d.tenant(requester)
	parts := *d.parts.Load()
	ids := make([]uint16, 0, len(domains))
	incomplete := false
	d.nmu.RLock()
	for _, dom := range domains {
		if pid, ok := d.partID[dom]; ok {
			ids = append(ids, pid)
			incomplete = incomplete || int(pid) < len(parts) && parts[pid].incomplete.Load() != 0
		}
	}
	d.nmu.RUnlock()
	if incomplete {
		d.scannedIncomplete.Add(1)
	}
	return &Scanner{src: d, r: roller{h: d.h}, requester: id, path: path{parts: ids}, own: own}
}

// PartitionStats is one partition's state.
type PartitionStats struct {
	Domain       string
	Budget       int64 // fingerprints it keeps at least
	Fingerprints int64 // live entries
	// OldestAge is how old its oldest live entry is at the time asked (0 when empty): what the
	// partition still covers. Below the detect window under load means the pool, not the
	// window, bounds detection there, as it should; a partition whose text is evicted far
	// sooner than its engine's cache turns over would show here first.
	OldestAge time.Duration
	Evicted   uint64 // entries dropped by the budget or the window
	// EvictedYoung: entries the budget dropped before the detect window ended.
	EvictedYoung uint64
	Incomplete   Incomplete
}

// DomainsStats is the whole index's state: per partition, and the counters the gateway
// exports (kvgate_fingerprint_partition_oldest_age_seconds{domain},
// kvgate_fingerprint_partition_evicted_young_total{domain},
// kvgate_fingerprint_partitions_incomplete{reason}, kvgate_fingerprint_scanned_incomplete_total).
type DomainsStats struct {
	Partitions []PartitionStats
	// Common: markers of text CommonTenants tenants sent; Public: shipped and operator's
	// public text.
	Common, Public int64
	// ScannedIncomplete: replies scanned against a route with an incomplete partition.
	ScannedIncomplete uint64
	// Bootstrapping, Gapped, Stale: partitions incomplete for each reason.
	Bootstrapping, Gapped, Stale int
	// TableBytes is the table's heap (entries, live or dead, and free slots).
	TableBytes int64
}

// Stats reads the state at now.
func (d *Domains) Stats(now time.Time) DomainsStats {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	parts := *d.parts.Load()
	st := DomainsStats{ScannedIncomplete: d.scannedIncomplete.Load(), Public: parts[boilerplatePart].total, Common: parts[commonPart].total}
	for i := range d.shards {
		st.TableBytes += int64(len(*d.shards[i].tab.Load())) * 8
	}
	for _, p := range parts[firstDomainPart:] {
		ps := PartitionStats{Domain: p.name, Budget: p.budget, Fingerprints: p.total, Evicted: p.evicted,
			EvictedYoung: p.evictedYoung.Load(), Incomplete: Incomplete(p.incomplete.Load())}
		for g := p.oldest; g != p.cur+1; g++ {
			if gen := p.gens[g%generations]; gen.count > 0 {
				ps.OldestAge = time.Duration(max(0, now.UnixNano()-gen.oldest))
				break
			}
		}
		for why, n := range map[Incomplete]*int{Bootstrapping: &st.Bootstrapping, Gapped: &st.Gapped, Stale: &st.Stale} {
			if ps.Incomplete&why != 0 {
				*n++
			}
		}
		st.Partitions = append(st.Partitions, ps)
	}
	return st
}
