package fingerprint

import (
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"
)

// Match is one foreign fingerprint found in a reply: what an incident keeps instead of text.
type Match struct {
	Fingerprint string `json:"fingerprint"` // hex of the keyed hash (meaningless without the secret)
	End         int    `json:"end"`         // byte offset in the reply's text where the shingle ends
	Length      int    `json:"length"`      // the shingle's length in folded characters
	Victim      string `json:"victim"`      // the tenant whose recent prompt holds it
}

// maxKeptMatches bounds what a Scanner keeps for the incident.
const maxKeptMatches = 16

// MaxScanBytes is how much of a reply's text a Scanner reads: a leak of stale pages shows at the
// start of what the engine generates, and hashing costs about 50 ns per byte, so a 60 MB reply
// is not hashed whole (the marker scanners still read all of it).
const MaxScanBytes = 4 << 20

// lookupBatch bounds the shingles waiting for one index lookup (memory per Feed call).
const lookupBatch = 4096

// Scanner hashes one reply's text as it streams and counts the fingerprints that are another
// tenant's recent prompt text. Not safe for concurrent use (one per reply).
type Scanner struct {
	src       source
	r         roller
	requester uint32
	path      path
	own       *Own
	offset    int
	seen      map[uint64]uint32 // distinct foreign fingerprints → victim
	matches   []Match
	pending   []shingle
	perVictim map[uint32]int
	leak      bool
}

type shingle struct {
	v   uint64
	end int
}

// source is what a Scanner checks fingerprints against: the replica-wide Index or the
// partitioned Domains. verdict is called between rlock and runlock.
type source interface {
	hasher() *Hasher
	cutMatches() int
	rlock()
	runlock()
	verdict(fp uint64, requester uint32, p *path) (verdict, uint32)
	name(id uint32) string
}

// path is a reply's route as its source reads it: the Index's backend bits, the Domains'
// partition ids.
type path struct {
	mask  uint64
	parts []uint16
}

// NewScanner scans a reply to requester, served over backends, whose own prompt is own (nil:
// none readable).
func (ix *Index) NewScanner(requester string, backends []string, own *Own) *Scanner {
	ix.mu.Lock()
	id, m := ix.tenant(requester), ix.mask(backends)
	ix.mu.Unlock()
	return &Scanner{src: ix, r: roller{h: ix.h}, requester: id, path: path{mask: m}, own: own}
}

// Fork is a new scanner of another reading of the same reply (one choice's or field's text, as
// a client assembles it): same requester, path and own prompt, its own matches.
func (s *Scanner) Fork() *Scanner {
	return &Scanner{src: s.src, r: roller{h: s.src.hasher()}, requester: s.requester, path: s.path, own: s.own}
}

// Clone is a copy of the scanner as it stands: the text read so far and its matches, read on
// separately.
func (s *Scanner) Clone() *Scanner {
	c := *s
	c.r.pend, c.r.buf = slices.Clone(s.r.pend), nil
	c.seen, c.perVictim = maps.Clone(s.seen), maps.Clone(s.perVictim)
	c.matches, c.pending = slices.Clone(s.matches), nil
	return &c
}

// Feed scans the next piece of the reply's text (in the order a client reads it) and reports
// whether the reply is now a leak: Config.CutMatches distinct foreign fingerprints.
func (s *Scanner) Feed(text string) bool {
	if s.leak {
		return true
	}
	if s.offset >= MaxScanBytes {
		return false
	}
	text = text[:min(len(text), MaxScanBytes-s.offset)]
	s.pending = s.pending[:0]
	s.r.feed(text, s.offset, false, func(v uint64, end int) {
		if !s.own.has(v) && !s.leak {
			s.pending = append(s.pending, shingle{v, end})
			if len(s.pending) == lookupBatch {
				s.lookup()
				s.pending = s.pending[:0]
			}
		}
	})
	s.offset += len(text)
	if len(s.pending) > 0 {
		s.lookup()
	}
	return s.leak
}

// lookup checks the pending shingles against the index.
func (s *Scanner) lookup() {
	src := s.src
	src.rlock()
	defer src.runlock()
	h := src.hasher()
	for _, sh := range s.pending {
		fp := h.final(sh.v)
		if _, dup := s.seen[fp]; dup {
			continue
		}
		vd, victim := src.verdict(fp, s.requester, &s.path)
		if vd != foreign {
			continue
		}
		if s.seen == nil {
			s.seen, s.perVictim = map[uint64]uint32{}, map[uint32]int{}
		}
		s.seen[fp] = victim
		s.perVictim[victim]++
		if len(s.matches) < maxKeptMatches {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], fp)
			s.matches = append(s.matches, Match{Fingerprint: hex.EncodeToString(b[:]), End: sh.end, Length: Shingle, Victim: src.name(victim)})
		}
		if len(s.seen) >= src.cutMatches() {
			s.leak = true
			return
		}
	}
}

// Leak says the reply carried enough foreign fingerprints to be cut.
func (s *Scanner) Leak() bool { return s.leak }

// Count is the number of distinct foreign fingerprints seen so far (below CutMatches and the
// reply ends: a weak match, counted but not an incident).
func (s *Scanner) Count() int { return len(s.seen) }

// Victim is the tenant with the most foreign fingerprints in the reply ("" when none).
func (s *Scanner) Victim() string {
	best, n := uint32(0), 0
	for v, c := range s.perVictim {
		if c > n || c == n && v < best {
			best, n = v, c
		}
	}
	if n == 0 {
		return ""
	}
	s.src.rlock()
	defer s.src.runlock()
	return s.src.name(best)
}

// Matches are the first foreign fingerprints found (at most 16): hashes, offsets and lengths,
// no text.
func (s *Scanner) Matches() []Match { return s.matches }

// Victims is the number of distinct tenants whose fingerprints the reply carried.
func (s *Scanner) Victims() int { return len(s.perVictim) }
