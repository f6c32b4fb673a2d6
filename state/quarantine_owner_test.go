package state

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// fakeStore is a quarantine store that can be made unreachable, and that records writes.
type fakeStore struct {
	mu     sync.Mutex
	flags  map[string]time.Time
	down   bool
	writes int
	now    func() time.Time
	// beforeWrite, if set, runs as a Quarantine write begins (to interleave a release with it).
	beforeWrite func()
}

var errDown = errors.New("store unreachable")

func (f *fakeStore) Quarantine(_ context.Context, b, _ string, ttl time.Duration) error {
	if f.beforeWrite != nil {
		f.beforeWrite()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errDown
	}
	f.writes++
	f.flags[b] = f.now().Add(ttl)
	return nil
}

func (f *fakeStore) Release(_ context.Context, b string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errDown
	}
	delete(f.flags, b)
	return nil
}

func (f *fakeStore) Active(context.Context) (map[string]time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errDown
	}
	out := map[string]time.Time{}
	for k, v := range f.flags {
		if v.After(f.now()) {
			out[k] = v
		}
	}
	return out, nil
}

type qRig struct {
	clock   time.Time
	store   *fakeStore
	q       *Quarantines
	applied map[string]time.Time
}

func newQRig() *qRig {
	r := &qRig{clock: time.Unix(1_000_000, 0)}
	now := func() time.Time { return r.clock }
	r.store = &fakeStore{flags: map[string]time.Time{}, now: now}
	r.q = NewQuarantines(r.store, func(m map[string]time.Time) { r.applied = m })
	r.q.now = now
	return r
}

func (r *qRig) out(name string) bool { _, ok := r.applied[name]; return ok }

func TestQuarantineMarkAppliesAtOnceAndShares(t *testing.T) {
	r := newQRig()
	ctx := context.Background()
	r.q.Mark("p0", 10*time.Minute, "leak r1")
	if !r.out("p0") {
		t.Fatal("a mark must take the backend out of rotation before any store write")
	}
	if err := r.q.Share(ctx, "p0"); err != nil || r.store.writes != 1 {
		t.Fatalf("share: %v, %d writes", err, r.store.writes)
	}
	r.clock = r.clock.Add(time.Second)
	r.q.Sync(ctx)
	if !r.out("p0") || len(r.q.local) != 0 {
		t.Fatalf("after a snapshot that has the flag, the store decides: applied %v, local %v", r.applied, r.q.local)
	}
	r.clock = r.clock.Add(10 * time.Minute)
	r.q.Sync(ctx)
	if r.out("p0") {
		t.Fatal("an expired quarantine must end")
	}
}

func TestQuarantineSurvivesAnUnreachableStore(t *testing.T) {
	r := newQRig()
	ctx := context.Background()
	r.store.down = true
	r.q.Mark("d0", 10*time.Minute, "leak r2")
	if err := r.q.Share(ctx, "d0"); err == nil {
		t.Fatal("share must report the store's failure")
	}
	r.q.Sync(ctx) // store away: nothing changes
	if !r.out("d0") {
		t.Fatal("a local flag must hold while the store is away")
	}
	r.store.down = false
	r.clock = r.clock.Add(time.Second)
	r.q.Sync(ctx) // merges the unstored flag and retries the write
	if !r.out("d0") || r.store.writes != 1 {
		t.Fatalf("the flag must be retried into the store: applied %v, writes %d", r.applied, r.store.writes)
	}
	if _, ok := r.store.flags["d0"]; !ok {
		t.Fatal("store lacks the retried flag")
	}
}

// Another replica's release lifts a flag this replica stored; a snapshot read before this
// replica's write cannot lift it.
func TestQuarantineReleaseAndStaleSnapshots(t *testing.T) {
	r := newQRig()
	ctx := context.Background()
	r.q.Mark("p0", time.Hour, "leak")
	_ = r.q.Share(ctx, "p0")
	// A snapshot read at the same instant as the write (not after it) keeps the local flag.
	r.q.Sync(ctx)
	if !r.out("p0") || len(r.q.local) != 1 {
		t.Fatalf("a snapshot not read after the write must not decide: %v %v", r.applied, r.q.local)
	}
	r.clock = r.clock.Add(time.Second)
	r.q.Sync(ctx)
	// An operator releases through another replica: the store no longer has it.
	_ = r.store.Release(ctx, "p0")
	r.clock = r.clock.Add(time.Second)
	r.q.Sync(ctx)
	if r.out("p0") {
		t.Fatal("a release on another replica must reach this one")
	}
	// A release here while the store is away fails and keeps the flag.
	r.q.Mark("d0", time.Hour, "leak")
	r.store.down = true
	if err := r.q.Release(ctx, "d0"); err == nil || !r.out("d0") {
		t.Fatal("a release the store did not take must leave the quarantine in force")
	}
	r.store.down = false
	if err := r.q.Release(ctx, "d0"); err != nil || r.out("d0") {
		t.Fatalf("release: %v, applied %v", err, r.applied)
	}
}

// An operator's release that lands while a leak's Share is writing the same flag stands: the
// write that raced it is taken back, so no replica's next sync quarantines the backend again.
func TestQuarantineReleaseDuringShareStands(t *testing.T) {
	r := newQRig()
	ctx := context.Background()
	r.q.Mark("p0", time.Hour, "leak r9")
	r.store.beforeWrite = func() {
		r.store.beforeWrite = nil
		if err := r.q.Release(ctx, "p0"); err != nil { // between Share's read of the flag and its write
			t.Error(err)
		}
	}
	if err := r.q.Share(ctx, "p0"); err != nil {
		t.Fatal(err)
	}
	r.clock = r.clock.Add(time.Second)
	r.q.Sync(ctx)
	if _, stored := r.store.flags["p0"]; stored || r.out("p0") {
		t.Fatalf("the release was undone by the write it raced: store %v, applied %v", r.store.flags, r.applied)
	}
}
