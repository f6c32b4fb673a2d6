package fingerprint

import (
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// The Domains' table: one open-addressing hash table keyed by fingerprint, whose entries are
// (fingerprint, tenant, partition, generation) in 16 bytes: the fingerprint in one word, the rest
// packed in the other (meta). Buckets of 4 entries (64 bytes, one cache line) are probed in
// order from the fingerprint's home bucket up to the first bucket with a free slot, so a lookup
// reads every entry of one fingerprint (all its tenants and partitions) in one probe sequence,
// almost always one cache line.
//
// The table is split into 256 shards by the fingerprint's low bits (the home bucket comes from
// its high bits), each grown or rebuilt on its own, so that no rebuild copies more than 1/256 of
// the table. Readers take no lock: a shard's sequence counter is odd while a writer changes one
// of its entries, and a reader that saw it move reads again (a seqlock); a rebuild fills a new
// array beside the old one and swaps the pointer, so readers never wait for it. Writers are
// serialised by the Domains' write lock.

const (
	shardBits    = 8
	shardCount   = 1 << shardBits
	bucketSlots  = 4
	bucketWords  = 2 * bucketSlots
	minBuckets   = 4
	maxLoadNum   = 75 // a shard is rebuilt when more than 75% of its slots are taken
	targetLoadNm = 60 // and rebuilt to hold its live entries at 60%
)

// meta layout: tenant (24 bits) | partition (16) | generation (24).
const (
	genBits       = 24
	genMask       = 1<<genBits - 1
	partShift     = genBits
	tenantShift   = genBits + 16
	maxTenantID   = 1<<24 - 2
	commonTenant  = 1<<24 - 1 // the marker entry of a fingerprint that is common text
	tombstone     = 0         // tenant 0: a deleted entry, its slot reusable
	maxPartitions = 1 << 16
)

func packMeta(tenant uint32, part uint16, gen uint32) uint64 {
	return uint64(tenant)<<tenantShift | uint64(part)<<partShift | uint64(gen&genMask)
}

func metaTenant(m uint64) uint32 { return uint32(m >> tenantShift) }
func metaPart(m uint64) uint16   { return uint16(m >> partShift) }
func metaGen(m uint64) uint32    { return uint32(m & genMask) }

// key is the fingerprint as the table stores it: 0 marks an empty slot.
func key(fp uint64) uint64 {
	if fp == 0 {
		return 1
	}
	return fp
}

type shard struct {
	seq  atomic.Uint64
	tab  atomic.Pointer[[]atomic.Uint64]
	used int // slots with a fingerprint (live, dead or tombstone); write lock
	_    [40]byte
}

func newSlots(buckets int) *[]atomic.Uint64 {
	s := make([]atomic.Uint64, buckets*bucketWords)
	return &s
}

func home(fp uint64, buckets int) int {
	hi, _ := bits.Mul64(fp, uint64(buckets))
	return int(hi)
}

// set writes one slot; called with the write lock held, inside begin/end.
func set(tab []atomic.Uint64, i int, fp, meta uint64) {
	tab[i+1].Store(meta)
	tab[i].Store(fp)
}

func (sh *shard) begin() { sh.seq.Add(1) }
func (sh *shard) end()   { sh.seq.Add(1) }

// rebuild copies the shard's live entries (alive says which) into a new array sized for them
// at the target load, and swaps it in. Write lock held; readers go on reading the old array.
// The new array is filled with plain stores: no reader sees it before the pointer's atomic
// store publishes it.
func (sh *shard) rebuild(alive func(meta uint64) bool) {
	old := *sh.tab.Load()
	live := 0
	for i := 0; i < len(old); i += 2 {
		if old[i].Load() != 0 && alive(old[i+1].Load()) {
			live++
		}
	}
	buckets := max(minBuckets, (live*100/targetLoadNm+bucketSlots-1)/bucketSlots)
	t := make([]uint64, buckets*bucketWords)
	// The old array holds entries nearly in order of their home bucket, which is monotonic in
	// the fingerprint whatever the size: those in order are laid down one after another, each
	// at its home or right after the one before (so every bucket between them is full, as a
	// lookup needs), with stores only; the few out of order are placed by probing after.
	var late []uint64
	next, lastHome := 0, 0 // slot indices
	for i := 0; i < len(old); i += 2 {
		fp, m := old[i].Load(), old[i+1].Load()
		if fp == 0 || !alive(m) {
			continue
		}
		h := home(fp, buckets) * bucketSlots
		if p := max(h, next); h >= lastHome && p < buckets*bucketSlots {
			t[2*p], t[2*p+1] = fp, m
			next, lastHome = p+1, h
			continue
		}
		late = append(late, fp, m)
	}
	for i := 0; i < len(late); i += 2 {
		fp := late[i]
		for b := home(fp, buckets); ; b = (b + 1) % buckets {
			j := b * bucketWords
			for ; j < (b+1)*bucketWords && t[j] != 0; j += 2 {
			}
			if j < (b+1)*bucketWords {
				t[j], t[j+1] = fp, late[i+1]
				break
			}
		}
	}
	tab := unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(t))), len(t))
	sh.used = live
	sh.tab.Store(&tab)
}

// full says the shard must be rebuilt before one more slot is taken.
func (sh *shard) full() bool {
	return (sh.used+1)*100 > len(*sh.tab.Load())/2*maxLoadNum
}
