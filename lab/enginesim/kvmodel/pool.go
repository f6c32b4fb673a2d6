package kvmodel

import (
	"fmt"
	"math/rand/v2"
)

// Allocator policies for free pages.
const (
	AllocLIFO   = "lifo"   // most recently released page first (SGLang's free list behaves like this)
	AllocFIFO   = "fifo"   // least recently released page first
	AllocRandom = "random" // uniformly random free page
)

// PageTag is what a page remembers about its last writer at page
// granularity; the leak experiments work on tags alone.
type PageTag struct {
	Writer uint64 // id of the request that last wrote the page; 0 = never written or cleared
	Tenant int32  // tenant of that request; -1 = none
	Marker bool   // the page holds its writer's canary marker (the writer's first page)
}

// Writer identifies a request that writes token slots.
type Writer struct {
	RID    string
	Tenant string
}

// Slot is one token position of the KV pool. Nothing clears it on release
// unless zero-on-release is on: its last writer and text stay readable.
type Slot struct {
	W    *Writer // nil = never written (or cleared)
	Text string
	ID   uint32
	Pos  int32 // the position in W's sequence: where a quote of a stale slot came from
}

// Pool is a paged KV pool: NumPages pages of PageSize token slots, handed
// out by an allocator policy and never zeroed on release (unless
// ZeroOnRelease). It is not safe for concurrent use; callers lock.
type Pool struct {
	PageSize      int
	NumPages      int
	ZeroOnRelease bool
	Tags          []PageTag
	Slots         []Slot // nil when the pool tracks pages only (leaklab)

	free freeList
}

// NewPool builds a pool of tokens/pageSize pages (rounded down, as SGLang
// rounds its pool to a page multiple). withSlots keeps per-token content.
func NewPool(tokens, pageSize int, allocator string, seed uint64, withSlots bool) (*Pool, error) {
	if pageSize <= 0 {
		return nil, fmt.Errorf("page size must be positive, got %d", pageSize)
	}
	n := tokens / pageSize
	if n <= 0 {
		return nil, fmt.Errorf("pool of %d tokens holds no page of %d tokens", tokens, pageSize)
	}
	p := &Pool{PageSize: pageSize, NumPages: n, Tags: make([]PageTag, n)}
	for i := range p.Tags {
		p.Tags[i].Tenant = -1
	}
	if withSlots {
		p.Slots = make([]Slot, n*pageSize)
	}
	if err := p.free.init(allocator, n, seed); err != nil {
		return nil, err
	}
	return p, nil
}

// Reset returns every page to the free list in the initial order and clears
// all content, as a freshly started server has it.
func (p *Pool) Reset(seed uint64) {
	for i := range p.Tags {
		p.Tags[i] = PageTag{Tenant: -1}
	}
	clear(p.Slots)
	_ = p.free.init(p.free.policy, p.NumPages, seed)
}

// Tokens is the pool size in tokens (a page multiple).
func (p *Pool) Tokens() int { return p.NumPages * p.PageSize }

// Free is the number of free pages.
func (p *Pool) Free() int { return p.free.len() }

// Alloc takes n pages from the free list, or none at all (ok false) when
// fewer than n are free.
func (p *Pool) Alloc(n int, dst []int32) ([]int32, bool) {
	if n > p.free.len() {
		return dst, false
	}
	for i := 0; i < n; i++ {
		dst = append(dst, p.free.pop())
	}
	return dst, true
}

// Release returns pages to the free list without clearing them (unless
// ZeroOnRelease). Pages are pushed last page first, so that with lifo the
// next request of the same size gets the same pages in the same order, as a
// stack-shaped free list does.
func (p *Pool) Release(pages []int32) {
	for i := len(pages) - 1; i >= 0; i-- {
		pg := pages[i]
		if p.ZeroOnRelease {
			p.Tags[pg] = PageTag{Tenant: -1}
			if p.Slots != nil {
				clear(p.Slots[int(pg)*p.PageSize : int(pg+1)*p.PageSize])
			}
		}
		p.free.push(pg)
	}
}

// SlotIndex maps a sequence position to its pool slot through the page table.
func (p *Pool) SlotIndex(pages []int32, pos int) int {
	return int(pages[pos/p.PageSize])*p.PageSize + pos%p.PageSize
}

// freeList is the allocator: one container, three policies.
type freeList struct {
	policy string
	items  []int32 // lifo: stack (top at end); random: bag; fifo: ring buffer
	head   int     // fifo: index of the oldest item
	n      int     // fifo: number of items
	rng    *rand.Rand
}

func (f *freeList) init(policy string, pages int, seed uint64) error {
	switch policy {
	case AllocLIFO, AllocFIFO, AllocRandom:
	default:
		return fmt.Errorf("unknown allocator %q (want lifo, fifo or random)", policy)
	}
	f.policy = policy
	if cap(f.items) < pages {
		f.items = make([]int32, pages)
	}
	f.items = f.items[:pages]
	switch policy {
	case AllocLIFO:
		// Page 0 on top: a fresh server hands out pages in index order.
		for i := range f.items {
			f.items[i] = int32(pages - 1 - i)
		}
	default:
		for i := range f.items {
			f.items[i] = int32(i)
		}
	}
	f.head, f.n = 0, pages
	f.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return nil
}

func (f *freeList) len() int {
	if f.policy == AllocFIFO {
		return f.n
	}
	return len(f.items)
}

func (f *freeList) pop() int32 {
	switch f.policy {
	case AllocFIFO:
		v := f.items[f.head]
		f.head = (f.head + 1) % len(f.items)
		f.n--
		return v
	case AllocRandom:
		i := f.rng.IntN(len(f.items))
		v := f.items[i]
		last := len(f.items) - 1
		f.items[i] = f.items[last]
		f.items = f.items[:last]
		return v
	default:
		last := len(f.items) - 1
		v := f.items[last]
		f.items = f.items[:last]
		return v
	}
}

func (f *freeList) push(pg int32) {
	if f.policy == AllocFIFO {
		f.items[(f.head+f.n)%len(f.items)] = pg
		f.n++
		return
	}
	f.items = append(f.items, pg)
}
