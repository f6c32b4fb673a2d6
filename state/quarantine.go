package state

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Quarantine flags backends that served a leak so that no replica routes to them until the flag
// expires or an operator releases it.
type Quarantine interface {
	// Quarantine flags backend for ttl (> 0). A second call replaces the first (reason and ttl).
	Quarantine(ctx context.Context, backend, reason string, ttl time.Duration) error
	Release(ctx context.Context, backend string) error
	// Active returns every flagged backend and when its flag expires.
	Active(ctx context.Context) (map[string]time.Time, error)
}

var (
	_ Quarantine = (*MemoryQuarantine)(nil)
	_ Quarantine = (*RedisQuarantine)(nil)
)

// ErrBadTTL is returned for a quarantine without a positive duration: a flag that never expires
// would need an operator, and one that expired at once would protect nothing.
var ErrBadTTL = errors.New("quarantine ttl must be positive")

// MemoryQuarantine is the single-replica implementation.
type MemoryQuarantine struct {
	mu    sync.Mutex
	until map[string]time.Time
	now   func() time.Time
}

// NewMemoryQuarantine returns an empty in-memory quarantine.
func NewMemoryQuarantine() *MemoryQuarantine {
	return &MemoryQuarantine{until: map[string]time.Time{}, now: time.Now}
}

func (m *MemoryQuarantine) Quarantine(_ context.Context, backend, _ string, ttl time.Duration) error {
	if ttl <= 0 {
		return ErrBadTTL
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.until[backend] = m.now().Add(ttl)
	return nil
}

func (m *MemoryQuarantine) Release(_ context.Context, backend string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.until, backend)
	return nil
}

func (m *MemoryQuarantine) Active(context.Context) (map[string]time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make(map[string]time.Time, len(m.until))
	for b, u := range m.until {
		if u.After(now) {
			out[b] = u
		} else {
			delete(m.until, b)
		}
	}
	return out, nil
}

// RedisQuarantine keeps one key per backend, prefix+"{kvgate}:quarantine:"+name, set with PX so
// Redis expires it, plus a set prefix+"{kvgate}:quarantined" of names so Active needs no SCAN.
// All keys share the {kvgate} hash tag: on Cluster they live in one slot.
type RedisQuarantine struct {
	client redis.UniversalClient
	prefix string
	// failClosed: the flags are models' fail-closed admission (count drift), not backends'
	// quarantine: the same flags under their own keys.
	failClosed bool
}

// NewRedisQuarantine returns a quarantine shared by every replica using the same Redis and prefix.
func NewRedisQuarantine(client redis.UniversalClient, prefix string) *RedisQuarantine {
	return &RedisQuarantine{client: client, prefix: prefix}
}

// NewRedisFailClosed returns the models' fail-closed flags (count drift) shared by every
// replica using the same Redis and prefix: flags like quarantine's, under keys of their own.
func NewRedisFailClosed(client redis.UniversalClient, prefix string) *RedisQuarantine {
	return &RedisQuarantine{client: client, prefix: prefix, failClosed: true}
}

func (r *RedisQuarantine) flagKey(name string) string {
	if r.failClosed {
		return Keys{r.prefix}.FailClosedFlag(name)
	}
	return Keys{r.prefix}.QuarantineFlag(name)
}

func (r *RedisQuarantine) setKey() string {
	if r.failClosed {
		return Keys{r.prefix}.FailClosed()
	}
	return Keys{r.prefix}.Quarantined()
}

func (r *RedisQuarantine) Quarantine(ctx context.Context, backend, reason string, ttl time.Duration) error {
	if ttl <= 0 {
		return ErrBadTTL
	}
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, r.flagKey(backend), reason, ttl)
		p.SAdd(ctx, r.setKey(), backend)
		return nil
	})
	if err != nil {
		return fmt.Errorf("quarantining backend %q: %w", backend, err)
	}
	return nil
}

func (r *RedisQuarantine) Release(ctx context.Context, backend string) error {
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, r.flagKey(backend))
		p.SRem(ctx, r.setKey(), backend)
		return nil
	})
	if err != nil {
		return fmt.Errorf("releasing backend %q: %w", backend, err)
	}
	return nil
}

// Active reads the set, then every flag's remaining time in one pipeline; names whose flag has
// expired are removed from the set.
func (r *RedisQuarantine) Active(ctx context.Context) (map[string]time.Time, error) {
	names, err := r.client.SMembers(ctx, r.setKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("reading quarantined backends: %w", err)
	}
	out := make(map[string]time.Time, len(names))
	if len(names) == 0 {
		return out, nil
	}
	now := time.Now()
	cmds := make([]*redis.DurationCmd, len(names))
	_, err = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range names {
			cmds[i] = p.PTTL(ctx, r.flagKey(n))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading quarantine flags: %w", err)
	}
	var gone []any
	for i, n := range names {
		d := cmds[i].Val()
		switch {
		case d > 0:
			out[n] = now.Add(d)
		case d == -1: // no expiry: cannot happen through Quarantine; treat as a long flag
			out[n] = now.Add(100 * 365 * 24 * time.Hour)
		default: // -2: expired
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		// Remove only names whose flag is still absent: one quarantined again since the PTTL
		// keeps its set entry. All keys share the {kvgate} slot, so this works on Cluster.
		keys := []string{r.setKey()}
		for _, n := range gone {
			keys = append(keys, r.flagKey(n.(string)))
		}
		_ = pruneScript.Run(ctx, r.client, keys, gone...).Err() // best effort: retried next poll
	}
	return out, nil
}

// pruneScript: KEYS[1] the set, KEYS[i+1] the flag of ARGV[i]; SREM each name whose flag is gone.
var pruneScript = redis.NewScript(`
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return 0`)
