package state_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/state"
)

// Replicas share fingerprint records through the stream: a follower catches up with what is
// there, then gets new records as they come, never its own; the stream expires. Real Redis.
func TestRedisPrintsShareRecords(t *testing.T) {
	c, prefix := testRedis(t)
	ctx := context.Background()
	r := state.NewRedisPrints(c, prefix, time.Minute, 0)
	if err := r.Publish(ctx, state.PrintsRecord{Origin: "A", Tenant: "alice", Backends: []string{"p0", "d0"}, FPs: []uint64{1, 1 << 63, 42}}); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, r.Key()).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("stream PTTL %v, want (0, 1m]", ttl)
	}
	got := make(chan state.PrintsRecord, 4)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Follow(fctx, "", func(_ string, rec state.PrintsRecord, ok bool) {
			if ok && rec.Origin != "B" {
				got <- rec
			}
		})
	}()
	defer func() { cancel(); <-done }()
	wait := func() state.PrintsRecord {
		select {
		case rec := <-got:
			return rec
		case <-time.After(3 * time.Second):
			t.Fatal("no record")
		}
		return state.PrintsRecord{}
	}
	rec := wait()
	if rec.Origin != "A" || rec.Tenant != "alice" || len(rec.Backends) != 2 || rec.Backends[1] != "d0" ||
		len(rec.FPs) != 3 || rec.FPs[1] != 1<<63 || rec.FPs[2] != 42 || time.Since(rec.At) > time.Minute {
		t.Fatalf("record %+v", rec)
	}
	// B's own record is not applied back to B; C's is.
	_ = r.Publish(ctx, state.PrintsRecord{Origin: "B", Tenant: "bob", FPs: []uint64{7}})
	_ = r.Publish(ctx, state.PrintsRecord{Origin: "C", Tenant: "carol", FPs: []uint64{8}})
	if rec := wait(); rec.Tenant != "carol" {
		t.Fatalf("want carol's record after skipping B's own, got %+v", rec)
	}
	// CatchUp reads what is there after an id at once, in order.
	var tenants []string
	var ids []string
	if err := r.CatchUp(ctx, "", func(id string, rec state.PrintsRecord, ok bool) {
		tenants, ids = append(tenants, rec.Tenant), append(ids, id)
	}); err != nil || strings.Join(tenants, ",") != "alice,bob,carol" {
		t.Fatalf("CatchUp from the start: %v %v", tenants, err)
	}
	tenants = nil
	if err := r.CatchUp(ctx, ids[0], func(_ string, rec state.PrintsRecord, _ bool) { tenants = append(tenants, rec.Tenant) }); err != nil ||
		strings.Join(tenants, ",") != "bob,carol" {
		t.Fatalf("CatchUp after the first: %v %v", tenants, err)
	}
	if !state.IDLess("", ids[0]) || !state.IDLess(ids[0], ids[1]) || state.IDLess(ids[2], ids[1]) || !state.IDLess("9-1", "10-0") || !state.IDLess("10-2", "10-10") {
		t.Fatal("IDLess order wrong")
	}
}
