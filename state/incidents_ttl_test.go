package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvgate/kvgate/state"
)

// Incidents have a retention: in Redis, a write trims entries older than the TTL and the stream
// expires TTL after its last write; List never returns an incident past it. Real Redis.
func TestRedisIncidentsExpire(t *testing.T) {
	c, prefix := testRedis(t)
	ctx := context.Background()
	r := state.NewRedisIncidents(c, prefix, 100, 10)
	r.TTL = 400 * time.Millisecond
	old := state.Incident{Time: time.Now().UTC(), Kind: state.KindLeak, RequestID: "old", Victim: "a", Requester: "b"}
	if err := r.Record(ctx, old); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, r.Key()).Val(); ttl <= 0 || ttl > 400*time.Millisecond {
		t.Fatalf("stream TTL after a write = %v, want (0, 400ms]", ttl)
	}
	time.Sleep(250 * time.Millisecond)
	fresh := old
	fresh.RequestID, fresh.Time = "fresh", time.Now().UTC()
	if err := r.Record(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	// "old" is now past its retention: List skips it even before Redis trims it.
	got, err := r.List(ctx, 0)
	if err != nil || ids(got) != "fresh" {
		t.Fatalf("List = %s, %v; want only fresh", ids(got), err)
	}
	// The next write trims it from the stream itself.
	third := old
	third.RequestID, third.Time = "third", time.Now().UTC()
	if err := r.Record(ctx, third); err != nil {
		t.Fatal(err)
	}
	if n := c.XLen(ctx, r.Key()).Val(); n != 2 {
		t.Fatalf("stream holds %d entries after the trim, want 2 (fresh, third)", n)
	}
	// Idle past the TTL: the stream itself is gone.
	deadline := time.Now().Add(3 * time.Second)
	for c.Exists(ctx, r.Key()).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("stream %s still exists %v after its last write's TTL", r.Key(), 3*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestMemoryIncidentsExpire(t *testing.T) {
	ctx := context.Background()
	m := state.NewMemoryIncidents(10)
	m.TTL = time.Hour
	_ = m.Record(ctx, state.Incident{Time: time.Now().Add(-2 * time.Hour), RequestID: "old", Victim: "a"})
	_ = m.Record(ctx, state.Incident{Time: time.Now(), RequestID: "new", Victim: "a"})
	if got, _ := m.List(ctx, 0); ids(got) != "new" {
		t.Fatalf("List = %s, want only new", ids(got))
	}
	if got, _ := m.List(ctx, 1); ids(got) != "new" {
		t.Fatalf("List(1) = %s, want new", ids(got))
	}
}
