package state

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Evidence that an incident rests on (Incident.Evidence).
const (
	EvidenceMarker = "marker" // a foreign canary marker: quarantines at once
	EvidenceText   = "text"   // another tenant's prompt text in one reply: cut, no quarantine
	// EvidenceTextCorroborated: text matches on the same engine for several requesters
	// against several victims within the corroboration window: quarantines.
	EvidenceTextCorroborated = "text_corroborated"
)

// TextEvidence keeps the prompt-text matches (package fingerprint) per backend that replicas
// share, and the quarantines each requester triggered on them. One tenant can make a reply look
// like another's text (it sends the ROT13 of a paragraph and asks for it decoded, or pastes
// boilerplate two tenants share), so one match takes no engine away from everyone: matches on
// one engine for several requesters against several victims do.
type TextEvidence interface {
	// Note records that a reply from backend to requester carried victim's prompt text at at,
	// and returns how many distinct requesters and victims such matches on backend had within
	// window before at (this one included).
	Note(ctx context.Context, backend, requester, victim string, at time.Time, window time.Duration) (requesters, victims int, err error)
	// Allow takes one of the max quarantines requester may trigger per window; false when it
	// has triggered max within the window that began with its first.
	Allow(ctx context.Context, requester string, max int, window time.Duration, at time.Time) (bool, error)
}

var (
	_ TextEvidence = (*MemoryTextEvidence)(nil)
	_ TextEvidence = (*RedisTextEvidence)(nil)
)

// maxEvidencePairs bounds the (requester, victim) pairs kept per backend: the newest stay.
const maxEvidencePairs = 256

// MemoryTextEvidence is the single-replica implementation (and a replica's own record while
// Redis is away).
type MemoryTextEvidence struct {
	mu      sync.Mutex
	matches map[string]map[[2]string]time.Time // backend → (requester, victim) → last seen
	quota   map[string]quotaWindow
}

type quotaWindow struct {
	until time.Time
	n     int
}

// NewMemoryTextEvidence returns an empty record.
func NewMemoryTextEvidence() *MemoryTextEvidence {
	return &MemoryTextEvidence{matches: map[string]map[[2]string]time.Time{}, quota: map[string]quotaWindow{}}
}

func (m *MemoryTextEvidence) Note(_ context.Context, backend, requester, victim string, at time.Time, window time.Duration) (int, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pairs := m.matches[backend]
	if pairs == nil {
		pairs = map[[2]string]time.Time{}
		m.matches[backend] = pairs
	}
	pairs[[2]string{requester, victim}] = at
	for p, t := range pairs {
		if at.Sub(t) > window {
			delete(pairs, p)
		}
	}
	for len(pairs) > maxEvidencePairs {
		oldest, first := [2]string{}, time.Time{}
		for p, t := range pairs {
			if first.IsZero() || t.Before(first) {
				oldest, first = p, t
			}
		}
		delete(pairs, oldest)
	}
	r, v := countPairs(func(yield func(string, string)) {
		for p := range pairs {
			yield(p[0], p[1])
		}
	})
	return r, v, nil
}

func (m *MemoryTextEvidence) Allow(_ context.Context, requester string, max int, window time.Duration, at time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.quota[requester]
	if !at.Before(q.until) {
		q = quotaWindow{until: at.Add(window)}
	}
	if q.n >= max {
		return false, nil
	}
	q.n++
	m.quota[requester] = q
	return true, nil
}

// countPairs counts the distinct requesters and victims of some pairs.
func countPairs(each func(yield func(requester, victim string))) (int, int) {
	rs, vs := map[string]bool{}, map[string]bool{}
	each(func(r, v string) { rs[r], vs[v] = true, true })
	return len(rs), len(vs)
}

// RedisTextEvidence shares the record between replicas: per backend a sorted set of
// "requester\x00victim" scored by the last match's time (milliseconds), trimmed to the window
// and to the newest maxEvidencePairs, expiring a window after the last write; per requester a
// counter of its quarantines that expires a window after the first.
type RedisTextEvidence struct {
	c    redis.UniversalClient
	keys Keys
}

// NewRedisTextEvidence returns the shared record under prefix.
func NewRedisTextEvidence(c redis.UniversalClient, prefix string) *RedisTextEvidence {
	return &RedisTextEvidence{c: c, keys: Keys{Prefix: prefix}}
}

func (r *RedisTextEvidence) Note(ctx context.Context, backend, requester, victim string, at time.Time, window time.Duration) (int, int, error) {
	key := r.keys.TextEvidence(backend)
	ms := at.UnixMilli()
	var members *redis.StringSliceCmd
	// One transaction on the control plane's slot: the write, the trims and the read agree.
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(ms), Member: requester + "\x00" + victim})
		p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(ms-window.Milliseconds(), 10))
		p.ZRemRangeByRank(ctx, key, 0, -maxEvidencePairs-1)
		members = p.ZRange(ctx, key, 0, -1)
		p.PExpire(ctx, key, window)
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	rq, vc := countPairs(func(yield func(string, string)) {
		for _, m := range members.Val() {
			if req, vic, ok := strings.Cut(m, "\x00"); ok {
				yield(req, vic)
			}
		}
	})
	return rq, vc, nil
}

func (r *RedisTextEvidence) Allow(ctx context.Context, requester string, max int, window time.Duration, _ time.Time) (bool, error) {
	key := r.keys.RequesterQuarantines(requester)
	var n *redis.IntCmd
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.SetNX(ctx, key, 0, window) // the window begins with the requester's first quarantine
		n = p.Incr(ctx, key)
		return nil
	})
	if err != nil {
		return false, err
	}
	return n.Val() <= int64(max), nil
}
