package enginesim

import (
	"container/list"
	"encoding/binary"
	"hash/maphash"
	"sync"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// prefixCache is the engine's prefix cache in two tiers, so that an audit can see whether salts
// partition it: the first (device memory, as SGLang's radix tree) holds as many blocks as the KV
// pool, least recently used first out; the second (host memory, as LMCache) is written through
// on every prefill and holds tier2Factor times more. A block is a page of tokens, keyed by a
// hash chained over the prompt's blocks so far, the salt mixed in first (vLLM's and SGLang's
// scheme): a prompt hits a cached block only if every block before it hit too. It holds hashes
// only; the pool's pages are what requests read.
type prefixCache struct {
	mu           sync.Mutex
	block        int
	seed         maphash.Seed
	tier1, tier2 *lru
	// Whether each tier's keys carry the salt: both, unless a bug drops it.
	salt1, salt2 bool
}

const tier2Factor = 8

func newPrefixCache(cfg Config) *prefixCache {
	pages := max(cfg.PoolTokens/cfg.PageSize, 1)
	c := &prefixCache{block: cfg.PageSize, seed: maphash.MakeSeed(),
		tier1: newLRU(pages), tier2: newLRU(tier2Factor * pages), salt1: true, salt2: true}
	switch cfg.Bug {
	case kvmodel.BugSaltIgnored:
		c.salt1, c.salt2 = false, false
	case kvmodel.BugSaltDroppedTier2:
		c.salt2 = false
	}
	return c
}

// chain is the key of every whole block of ids, the salt mixed in first when salted.
func (c *prefixCache) chain(salt string, salted bool, ids []uint32) []uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	if salted {
		h.WriteString(salt)
	}
	h.WriteByte(0)
	keys := make([]uint64, len(ids)/c.block)
	var b [4]byte
	for i := range keys {
		for _, id := range ids[i*c.block : (i+1)*c.block] {
			binary.LittleEndian.PutUint32(b[:], id)
			h.Write(b[:])
		}
		keys[i] = h.Sum64() // Sum64 leaves the state as it was: the next block chains on
	}
	return keys
}

// admit returns how many of the prompt's tokens were found cached (whole blocks, at most all
// but the last token, which the engine always computes, as SGLang does), then caches the
// prompt's blocks in both tiers.
func (c *prefixCache) admit(salt string, ids []uint32) int {
	k1 := c.chain(salt, c.salt1, ids)
	k2 := k1
	if c.salt2 != c.salt1 {
		k2 = c.chain(salt, c.salt2, ids)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hit := 0
	for hit < len(k1) && (c.tier1.has(k1[hit]) || c.tier2.has(k2[hit])) {
		hit++
	}
	for i := range k1 {
		c.tier1.put(k1[i])
		c.tier2.put(k2[i])
	}
	return min(hit*c.block, max(len(ids)-1, 0))
}

// lru is a bounded set of keys, the least recently used dropped first.
type lru struct {
	max   int
	order *list.List // front: most recent
	at    map[uint64]*list.Element
}

func newLRU(n int) *lru { return &lru{max: n, order: list.New(), at: map[uint64]*list.Element{}} }

func (l *lru) has(k uint64) bool {
	e, ok := l.at[k]
	if ok {
		l.order.MoveToFront(e)
	}
	return ok
}

func (l *lru) put(k uint64) {
	if e, ok := l.at[k]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[k] = l.order.PushFront(k)
	if l.order.Len() > l.max {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.at, old.Value.(uint64))
	}
}
