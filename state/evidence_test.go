package state_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/state"
)

// testTextEvidence: matches count distinct requesters and victims per backend within the
// window (a repeated pair counts once, older matches drop out, other backends do not count);
// a requester's quarantines are bounded per window, which starts with its first. b is a second
// handle on the same store (another replica), or a itself.
func testTextEvidence(t *testing.T, a, b state.TextEvidence) {
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	win := time.Hour
	note := func(e state.TextEvidence, backend, req, vic string, at time.Time, wantR, wantV int) {
		t.Helper()
		r, v, err := e.Note(ctx, backend, req, vic, at, win)
		if err != nil || r != wantR || v != wantV {
			t.Fatalf("Note(%s, %s→%s): %d requesters, %d victims, %v; want %d, %d", backend, req, vic, r, v, err, wantR, wantV)
		}
	}
	note(a, "eng", "bob", "alice", t0, 1, 1)
	note(b, "eng", "bob", "alice", t0.Add(time.Minute), 1, 1)  // the same pair again
	note(a, "eng", "bob", "dave", t0.Add(2*time.Minute), 1, 2) // one requester, two victims
	note(b, "other", "carol", "dave", t0.Add(3*time.Minute), 1, 1)
	note(b, "eng", "carol", "dave", t0.Add(4*time.Minute), 2, 2) // corroborated, seen by either
	// An hour after bob's last match, only carol's remains.
	note(a, "eng", "erin", "alice", t0.Add(2*time.Minute+win+time.Second), 2, 2)
	note(a, "eng", "erin", "alice", t0.Add(4*time.Minute+win+time.Second), 1, 1)

	allow := func(e state.TextEvidence, req string, at time.Time, want bool) {
		t.Helper()
		ok, err := e.Allow(ctx, req, 2, win, at)
		if err != nil || ok != want {
			t.Fatalf("Allow(%s at %s): %v %v, want %v", req, at.Sub(t0), ok, err, want)
		}
	}
	allow(a, "carol", t0, true)
	allow(b, "carol", t0.Add(time.Minute), true)
	allow(a, "carol", t0.Add(2*time.Minute), false)
	allow(b, "bob", t0.Add(2*time.Minute), true)
}

func TestMemoryTextEvidence(t *testing.T) {
	e := state.NewMemoryTextEvidence()
	testTextEvidence(t, e, e)
	// A new window begins after the last one ended (memory keeps its own clock: the times given).
	if ok, _ := e.Allow(context.Background(), "carol", 2, time.Hour, time.Unix(1_700_000_000, 0).Add(2*time.Hour)); !ok {
		t.Fatal("carol's quota did not come back after the window")
	}
}

func TestRedisTextEvidence(t *testing.T) {
	c, prefix := testRedis(t)
	testTextEvidence(t, state.NewRedisTextEvidence(c, prefix), state.NewRedisTextEvidence(secondClient(t), prefix))
	keys := state.Keys{Prefix: prefix}
	ctx := context.Background()
	if ttl := c.PTTL(ctx, keys.TextEvidence("eng")).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("evidence key TTL %s", ttl)
	}
	if ttl := c.PTTL(ctx, keys.RequesterQuarantines("carol")).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("requester quota TTL %s", ttl)
	}
	// Bounded: a flood of pairs keeps the newest 256.
	e := state.NewRedisTextEvidence(c, prefix)
	at := time.Unix(1_800_000_000, 0)
	for i := 0; i < 300; i++ {
		if _, _, err := e.Note(ctx, "flood", fmt.Sprintf("r%d", i), "v", at.Add(time.Duration(i)*time.Millisecond), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.ZCard(ctx, keys.TextEvidence("flood")).Val(); n != 256 {
		t.Fatalf("%d pairs kept, want 256", n)
	}
}
