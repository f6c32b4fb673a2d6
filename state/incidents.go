package state

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Incident kinds.
const (
	KindLeak = "leak"
	KindEcho = "echo"
	// KindCountDrift: an engine reported more prompt tokens than the bound admission used.
	KindCountDrift = "count_drift"
)

// Detectors: what found an incident.
const (
	DetectorMarker      = "marker"      // a foreign canary marker (or fragment)
	DetectorFingerprint = "fingerprint" // another tenant's prompt text (package fingerprint)
)

// Incident is one detection: a foreign marker or another tenant's prompt text (leak), or an
// echoed marker in a reply. It holds no text of the victim's unless canary.incident_context is
// on (Context): tenants, hashes, offsets and lengths.
type Incident struct {
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"` // KindLeak, KindEcho or KindCountDrift
	Detector  string    `json:"detector,omitempty"`
	RequestID string    `json:"request_id"`
	Victim    string    `json:"victim"`    // the tenant whose marker (or most of whose text) appeared
	Requester string    `json:"requester"` // the tenant who received it
	Backends  []string  `json:"backends"`  // every backend on the request's path
	Epoch     uint64    `json:"epoch"`     // the marker's epoch
	// Matches: distinct foreign fingerprints the reply carried before the cut, from Victims
	// tenants; Fingerprints are the first of them (keyed hashes, offsets in the reply's text).
	Matches      int                `json:"matches,omitempty"`
	Victims      int                `json:"victims,omitempty"`
	Fingerprints []FingerprintMatch `json:"fingerprints,omitempty"`
	// Context: up to 200 bytes around a marker hit, markers redacted; only with
	// canary.incident_context.
	Context string `json:"context,omitempty"`
	// Evidence is what a leak rests on: EvidenceMarker, EvidenceText (one reply's text match:
	// cut or flagged, no quarantine) or EvidenceTextCorroborated. Flagged: the reply was passed
	// on, not cut (canary.fingerprints.mode monitor). Quarantined: the backends were taken out.
	Evidence    string `json:"evidence,omitempty"`
	Flagged     bool   `json:"flagged,omitempty"`
	Quarantined bool   `json:"quarantined,omitempty"`
	// Count drift (KindCountDrift; Requester is the tenant): the model and route, the prompt
	// tokens the engine reported and the bound admission used. No prompt text.
	Model          string `json:"model,omitempty"`
	Route          string `json:"route,omitempty"`
	Tier           string `json:"tier,omitempty"`
	EngineTokens   int    `json:"engine_tokens,omitempty"`
	AdmittedTokens int    `json:"admitted_tokens,omitempty"`
}

// FingerprintMatch is one foreign fingerprint in a reply: no text, only where and whose.
type FingerprintMatch struct {
	Fingerprint string `json:"fingerprint"`
	End         int    `json:"end"`    // byte offset in the reply's text where the shingle ends
	Length      int    `json:"length"` // shingle length, normalised characters
	Victim      string `json:"victim"`
}

// expired says inc is past a retention of ttl at now (ttl ≤ 0 keeps everything).
func expired(inc Incident, ttl time.Duration, now time.Time) bool {
	return ttl > 0 && !inc.Time.IsZero() && now.Sub(inc.Time) > ttl
}

// IncidentLog stores incidents. Record must never lose an incident it accepted while the process
// lives: an implementation backed by a remote store queues on failure and returns nil.
type IncidentLog interface {
	Record(ctx context.Context, inc Incident) error
	List(ctx context.Context, limit int) ([]Incident, error) // newest first; limit ≤ 0: all kept
}

var (
	_ IncidentLog = (*MemoryIncidents)(nil)
	_ IncidentLog = (*RedisIncidents)(nil)
)

// MemoryIncidents keeps the last capacity incidents in memory (one replica only), each for TTL
// (0: until pushed out).
type MemoryIncidents struct {
	TTL  time.Duration
	mu   sync.Mutex
	ring []Incident
	next int // index of the oldest when full
	full bool
}

// NewMemoryIncidents returns a log that keeps the newest capacity incidents (capacity ≤ 0: 1000).
func NewMemoryIncidents(capacity int) *MemoryIncidents {
	if capacity <= 0 {
		capacity = 1000
	}
	return &MemoryIncidents{ring: make([]Incident, 0, capacity)}
}

// Record stores inc, evicting the oldest when full. It never fails.
func (m *MemoryIncidents) Record(_ context.Context, inc Incident) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ring) < cap(m.ring) {
		m.ring = append(m.ring, inc)
		return nil
	}
	m.ring[m.next] = inc
	m.next = (m.next + 1) % len(m.ring)
	return nil
}

// List returns up to limit incidents, newest first.
func (m *MemoryIncidents) List(_ context.Context, limit int) ([]Incident, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.ring)
	if limit <= 0 || limit > n {
		limit = n
	}
	out := make([]Incident, 0, limit)
	// The newest is just before next (or at the end while filling).
	newest := len(m.ring) - 1
	if len(m.ring) == cap(m.ring) {
		newest = (m.next - 1 + n) % n
	}
	now := time.Now()
	for i := 0; i < n && len(out) < limit; i++ {
		at := (newest - i + n) % n
		if expired(m.ring[at], m.TTL, now) {
			m.ring[at] = Incident{Time: m.ring[at].Time} // past its retention: nothing of it stays
			continue
		}
		out = append(out, m.ring[at])
	}
	return out, nil
}

// RedisIncidents stores incidents in a capped Redis stream (XADD MAXLEN ~ capacity) at
// prefix+"{kvgate}:incidents", one JSON field per entry, so every replica sees every incident.
//
// When Redis fails, Record queues the incident in memory (at most queueMax; beyond that new
// incidents are dropped and counted, since the oldest explain how an incident began) and returns
// nil. Run retries the queue with backoff in order; while the queue is not empty, new incidents
// go behind it, so the stream keeps the order of Record calls.
//
// With TTL set, every write also trims entries older than TTL (XTRIM MINID) and sets the stream
// to expire TTL after the last write, and List skips what is older: no incident outlives it.
type RedisIncidents struct {
	TTL      time.Duration
	client   redis.UniversalClient
	key      string
	capacity int64
	queueMax int

	mu    sync.Mutex // held across a direct XADD so no queued incident is overtaken
	queue []Incident
	wake  chan struct{}

	degraded atomic.Bool
	dropped  atomic.Uint64
	queued   atomic.Int64
}

// NewRedisIncidents returns a Redis-backed log. capacity ≤ 0 means 10000 entries; queueMax ≤ 0
// means 10000 queued incidents. Call Run in a goroutine so that queued incidents get written.
func NewRedisIncidents(client redis.UniversalClient, prefix string, capacity, queueMax int) *RedisIncidents {
	if capacity <= 0 {
		capacity = 10000
	}
	if queueMax <= 0 {
		queueMax = 10000
	}
	return &RedisIncidents{
		client:   client,
		key:      Keys{prefix}.Incidents(),
		capacity: int64(capacity),
		queueMax: queueMax,
		wake:     make(chan struct{}, 1),
	}
}

// Key returns the stream's key.
func (r *RedisIncidents) Key() string { return r.key }

// Degraded reports whether the last Redis call failed.
func (r *RedisIncidents) Degraded() bool { return r.degraded.Load() }

// QueueLen returns how many incidents wait for Redis.
func (r *RedisIncidents) QueueLen() int { return int(r.queued.Load()) }

// Dropped returns how many incidents were lost because the queue was full.
func (r *RedisIncidents) Dropped() uint64 { return r.dropped.Load() }

// recordTimeout bounds a direct write so that a hung Redis delays a caller at most this long.
const recordTimeout = 2 * time.Second

// Record writes inc to the stream, or queues it when Redis fails or earlier incidents are queued.
// It always returns nil: the caller has nothing better to do with a Redis error than this queue.
func (r *RedisIncidents) Record(ctx context.Context, inc Incident) error {
	if inc.Time.IsZero() {
		inc.Time = time.Now()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) == 0 {
		// The caller's cancellation (a client gone) must not drop or misfile the incident.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		err := r.add(cctx, inc)
		cancel()
		if err == nil {
			return nil
		}
	}
	if len(r.queue) >= r.queueMax {
		r.dropped.Add(1)
		return nil
	}
	r.queue = append(r.queue, inc)
	r.queued.Store(int64(len(r.queue)))
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return nil
}

func (r *RedisIncidents) add(ctx context.Context, inc Incident) error {
	body, err := json.Marshal(inc)
	if err != nil {
		return err
	}
	_, err = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAdd(ctx, &redis.XAddArgs{
			Stream: r.key,
			MaxLen: r.capacity,
			Approx: true,
			Values: []any{"incident", body},
		})
		if r.TTL > 0 {
			// Stream ids are Redis's clock in ms: drop every entry written before now − TTL.
			p.XTrimMinID(ctx, r.key, strconv.FormatInt(time.Now().Add(-r.TTL).UnixMilli(), 10))
			p.PExpire(ctx, r.key, r.TTL)
		}
		return nil
	})
	r.degraded.Store(err != nil)
	if err != nil {
		return fmt.Errorf("recording incident in %s: %w", r.key, err)
	}
	return nil
}

// Run writes queued incidents until ctx is done; start it once per RedisIncidents, retrying with backoff (100 ms doubling to 5 s)
// while Redis fails. The head of the queue is written before it is removed, so a crash of Redis
// between the two can only duplicate an entry, never lose one.
func (r *RedisIncidents) Run(ctx context.Context) {
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.mu.Lock()
		var head Incident
		has := len(r.queue) > 0
		if has {
			head = r.queue[0]
		}
		r.mu.Unlock()
		if !has {
			backoff = minBackoff
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
			case <-tick.C:
			}
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, recordTimeout)
		err := r.add(cctx, head)
		cancel()
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		r.mu.Lock()
		r.queue = r.queue[1:]
		if len(r.queue) == 0 {
			r.queue = nil // release the backing array after an outage
		}
		r.queued.Store(int64(len(r.queue)))
		r.mu.Unlock()
	}
}

// List returns up to limit incidents, newest first: queued ones (newer than anything in the
// stream) then the stream's. When Redis fails it returns the queued ones and the error.
func (r *RedisIncidents) List(ctx context.Context, limit int) ([]Incident, error) {
	r.mu.Lock()
	out := make([]Incident, 0, len(r.queue))
	for i := len(r.queue) - 1; i >= 0; i-- {
		out = append(out, r.queue[i])
	}
	r.mu.Unlock()
	if limit > 0 && len(out) >= limit {
		return out[:limit], nil
	}
	var msgs []redis.XMessage
	var err error
	if limit > 0 {
		msgs, err = r.client.XRevRangeN(ctx, r.key, "+", "-", int64(limit-len(out))).Result()
	} else {
		msgs, err = r.client.XRevRange(ctx, r.key, "+", "-").Result()
	}
	r.degraded.Store(err != nil)
	if err != nil {
		return out, fmt.Errorf("listing incidents from %s: %w", r.key, err)
	}
	now := time.Now()
	for _, m := range msgs {
		raw, _ := m.Values["incident"].(string)
		var inc Incident
		if err := json.Unmarshal([]byte(raw), &inc); err != nil {
			return out, fmt.Errorf("incident %s in %s: %w", m.ID, r.key, err)
		}
		if !expired(inc, r.TTL, now) {
			out = append(out, inc)
		}
	}
	return out, nil
}
