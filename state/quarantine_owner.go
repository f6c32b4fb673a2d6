package state

import (
	"context"
	"sync"
	"time"
)

// Quarantines is the one owner of backend quarantine on this replica: the flags this replica set
// (applied at once, kept until the shared store has them), the shared store every replica reads,
// and the backend set's routing flags, which it alone writes.
type Quarantines struct {
	store Quarantine
	// apply sets the routing flags: backends named are out of rotation until then, the others
	// are released (backends.Set.SetQuarantine).
	apply func(until map[string]time.Time)
	now   func() time.Time

	mu      sync.Mutex // held across apply, so a sync cannot apply an older snapshot over a flag
	local   map[string]localFlag
	current map[string]time.Time // what apply was last given
}

// localFlag is a quarantine this replica set. It is merged into every snapshot of the store
// until a snapshot read after the store had it: from then on the store decides (so an
// operator's release on any replica is not undone here, and a snapshot older than the flag
// cannot lift it).
type localFlag struct {
	until, storedAt time.Time // storedAt is zero until the store has the flag
	reason          string
}

func NewQuarantines(store Quarantine, apply func(map[string]time.Time)) *Quarantines {
	return &Quarantines{store: store, apply: apply, now: time.Now, local: map[string]localFlag{}, current: map[string]time.Time{}}
}

// Mark takes a backend out of rotation on this replica at once; Share writes it to the store.
func (q *Quarantines) Mark(name string, ttl time.Duration, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.local[name] = localFlag{until: q.now().Add(ttl), reason: reason}
	q.current[name] = q.local[name].until
	q.apply(copyFlags(q.current))
}

// Share writes a local flag to the store; on failure it stays local and Sync retries it.
func (q *Quarantines) Share(ctx context.Context, name string) error {
	q.mu.Lock()
	f, ok := q.local[name]
	q.mu.Unlock()
	if !ok {
		return nil
	}
	if err := q.store.Quarantine(ctx, name, f.reason, f.until.Sub(q.now())); err != nil {
		return err
	}
	q.mu.Lock()
	cur, still := q.local[name]
	if still && cur.storedAt.IsZero() {
		cur.storedAt = q.now()
		q.local[name] = cur
	}
	q.mu.Unlock()
	if !still {
		// An operator released the backend while this write was on its way: the release came
		// after the leak that wrote it, so it stands (without this, the store would quarantine
		// the backend again on every replica's next sync).
		return q.store.Release(ctx, name)
	}
	return nil
}

// Sync merges the store's flags with this replica's own and applies them; with the store away,
// what this replica has stays in force.
func (q *Quarantines) Sync(ctx context.Context) {
	readAt := q.now()
	active, err := q.store.Active(ctx)
	if err != nil {
		return
	}
	now := q.now()
	var retry []string
	q.mu.Lock()
	for name, f := range q.local {
		switch {
		case !f.until.After(now):
			delete(q.local, name)
		case !f.storedAt.IsZero() && f.storedAt.Before(readAt):
			delete(q.local, name) // this snapshot was read after the store had the flag
		case f.storedAt.IsZero():
			retry = append(retry, name) // our write failed (the store was away)
			active[name] = f.until
		default:
			active[name] = f.until // stored after this snapshot was read
		}
	}
	q.current = active
	q.apply(copyFlags(active))
	q.mu.Unlock()
	for _, name := range retry {
		_ = q.Share(ctx, name)
	}
}

// Release lifts a quarantine for every replica: the store first (so a failure leaves it in
// force everywhere), then this replica's own flag.
func (q *Quarantines) Release(ctx context.Context, name string) error {
	if err := q.store.Release(ctx, name); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.local, name)
	delete(q.current, name)
	q.apply(copyFlags(q.current))
	return nil
}

func copyFlags(m map[string]time.Time) map[string]time.Time {
	out := make(map[string]time.Time, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
