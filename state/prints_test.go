package state_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/state"
)

// Replicas share fingerprint records through the stream: a publish reads back, in its round
// trip, every record written after the id it names, its own included and in order; the stream
// expires. Real Redis.
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
	var got []state.PrintsRecord
	var last string
	collect := func(id string, rec state.PrintsRecord, ok bool) {
		if !ok || !state.IDLess(last, id) {
			t.Fatalf("record %s (decoded %v) after %s", id, ok, last)
		}
		last, got = id, append(got, rec)
	}
	// B publishes from the start: it gets A's record, then its own.
	if err := r.PublishBatch(ctx, []state.PrintsRecord{{Origin: "B", Tenant: "bob", FPs: []uint64{7}}}, "", collect); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].Tenant != "bob" {
		t.Fatalf("read back %+v, want alice's then bob's", got)
	}
	rec := got[0]
	if rec.Origin != "A" || rec.Tenant != "alice" || len(rec.Backends) != 2 || rec.Backends[1] != "d0" ||
		len(rec.FPs) != 3 || rec.FPs[1] != 1<<63 || rec.FPs[2] != 42 || time.Since(rec.At) > time.Minute {
		t.Fatalf("record %+v", rec)
	}
	// C writes; B's next publish reads C's record and its own, nothing before its last read.
	_ = r.Publish(ctx, state.PrintsRecord{Origin: "C", Tenant: "carol", FPs: []uint64{8}})
	got = nil
	if err := r.PublishBatch(ctx, []state.PrintsRecord{{Origin: "B", Tenant: "bob", FPs: []uint64{9}}}, last, collect); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Tenant != "carol" || got[1].FPs[0] != 9 {
		t.Fatalf("read back %+v, want carol's then bob's second", got)
	}
	// CatchUp reads what is there after an id at once, in order.
	var tenants []string
	var ids []string
	if err := r.CatchUp(ctx, "", func(id string, rec state.PrintsRecord, ok bool) {
		tenants, ids = append(tenants, rec.Tenant), append(ids, id)
	}); err != nil || strings.Join(tenants, ",") != "alice,bob,carol,bob" {
		t.Fatalf("CatchUp from the start: %v %v", tenants, err)
	}
	tenants = nil
	if err := r.CatchUp(ctx, ids[0], func(_ string, rec state.PrintsRecord, _ bool) { tenants = append(tenants, rec.Tenant) }); err != nil ||
		strings.Join(tenants, ",") != "bob,carol,bob" {
		t.Fatalf("CatchUp after the first: %v %v", tenants, err)
	}
	if !state.IDLess("", ids[0]) || !state.IDLess(ids[0], ids[1]) || state.IDLess(ids[2], ids[1]) || !state.IDLess("9-1", "10-0") || !state.IDLess("10-2", "10-10") {
		t.Fatal("IDLess order wrong")
	}
}
