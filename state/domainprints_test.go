package state_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/redistest"
)

func seqFPs(from, n int) []uint64 {
	fps := make([]uint64, n)
	for i := range fps {
		fps[i] = uint64(from+i) * 0x9e3779b97f4a7c15
	}
	return fps
}

type pulledRecs struct {
	recs []state.DomainRecord
}

func (p *pulledRecs) apply(_ string, rec state.DomainRecord) { p.recs = append(p.recs, rec) }

// Replicas share one domain's records through its stream: in order, with origin, tenant, time
// and fingerprints; a prompt over chunkFPs fingerprints takes several entries and arrives
// whole; the stream is trimmed to the budget, so a new replica bootstraps from the last budget
// of fingerprints alone; a reader that fell behind the trim counts the gap, in fingerprints,
// and stays gapped until the stream has turned over past it. Real Redis.
func TestDomainPrintsShareTrimAndGap(t *testing.T) {
	c, prefix := testRedis(t)
	ctx := context.Background()
	a, b := state.NewDomainPrints(c, prefix, time.Minute), state.NewDomainPrints(c, prefix, time.Minute)
	at := time.UnixMilli(1_700_000_000_000)
	if err := a.Publish(ctx, []state.DomainBatch{{Domain: "e1", Budget: 350, Records: []state.DomainRecord{
		{Origin: "A", Tenant: "alice", At: at, FPs: seqFPs(0, 100)},
		{Origin: "A", Tenant: "bob", At: at.Add(time.Second), FPs: seqFPs(100, 1200)}, // 3 entries
	}}}); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, a.Key("e1")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("stream PTTL %v", ttl)
	}
	var got pulledRecs
	res := b.Pull(ctx, []string{"e1"}, got.apply)
	// Budget 350 of 1300: the entries ending past 950 stay: bob's last two chunks (1124, 1300).
	if res[0].Err != nil || res[0].Gap != 0 || len(got.recs) != 2 || got.recs[0].Tenant != "bob" || got.recs[1].Origin != "A" ||
		!got.recs[0].At.Equal(at.Add(time.Second)) || len(got.recs[0].FPs)+len(got.recs[1].FPs) != 1300-612 {
		t.Fatalf("bootstrap read %+v: %d records", res, len(got.recs))
	}
	if st := b.State("e1", time.Now()); st.Bootstrapping || st.Gapped || st.Stale {
		t.Fatalf("after a read to the end: %+v", st)
	}
	// B reads on: only what came after.
	got.recs = nil
	_ = a.Publish(ctx, []state.DomainBatch{{Domain: "e1", Budget: 350, Records: []state.DomainRecord{{Origin: "A", Tenant: "carol", At: at, FPs: seqFPs(5000, 10)}}}})
	if res := b.Pull(ctx, []string{"e1"}, got.apply); res[0].Gap != 0 || len(got.recs) != 1 || got.recs[0].FPs[9] != seqFPs(5000, 10)[9] {
		t.Fatalf("next read %+v %+v", res, got.recs)
	}
	// 1000 fingerprints more before B reads again: 660 of them trimmed unread.
	for i := 0; i < 10; i++ {
		_ = a.Publish(ctx, []state.DomainBatch{{Domain: "e1", Budget: 350, Records: []state.DomainRecord{{Origin: "A", Tenant: "dave", At: at, FPs: seqFPs(6000+100*i, 100)}}}})
	}
	before := b.Stats()
	got.recs = nil
	res = b.Pull(ctx, []string{"e1"}, got.apply)
	if res[0].Gap != 600 || len(got.recs) != 4 || b.Stats().Gaps != before.Gaps+1 || b.Stats().GapFingerprints != before.GapFingerprints+600 {
		t.Fatalf("after falling behind: %+v, %d records, stats %+v", res, len(got.recs), b.Stats())
	}
	if !b.State("e1", time.Now()).Gapped {
		t.Fatal("a gap not reported in the domain's state")
	}
	for i := 0; i < 4; i++ {
		_ = a.Publish(ctx, []state.DomainBatch{{Domain: "e1", Budget: 350, Records: []state.DomainRecord{{Origin: "A", Tenant: "erin", At: at, FPs: seqFPs(9000+100*i, 100)}}}})
		b.Pull(ctx, []string{"e1"}, got.apply)
	}
	if b.State("e1", time.Now()).Gapped {
		t.Fatal("still gapped after the stream turned over past the gap")
	}
	// A domain never written: read, empty, not bootstrapping; a stream created again after it
	// expired is read from its start (counted).
	if res := b.Pull(ctx, []string{"e9"}, got.apply); res[0].Err != nil || b.State("e9", time.Now()).Bootstrapping {
		t.Fatalf("empty domain: %+v %+v", res, b.State("e9", time.Now()))
	}
	c.Del(ctx, a.Key("e1"))
	_ = a.Publish(ctx, []state.DomainBatch{{Domain: "e1", Budget: 350, Records: []state.DomainRecord{{Origin: "A", Tenant: "fred", At: at, FPs: seqFPs(1, 5)}}}})
	got.recs = nil
	for i := 0; i < 3 && len(got.recs) == 0; i++ {
		b.Pull(ctx, []string{"e1"}, got.apply)
	}
	if len(got.recs) != 1 || got.recs[0].Tenant != "fred" || b.Stats().Restarts != 1 {
		t.Fatalf("after the stream was created again: %+v, stats %+v", got.recs, b.Stats())
	}
}

// A read takes at most ReadBytes of a stream (whole entries), and at most one read of a domain
// is in flight per replica: a second Pull while the first waits on Redis skips it (Busy).
func TestDomainPrintsReadsSizedAndOneInFlight(t *testing.T) {
	c, prefix := testRedis(t)
	ctx := context.Background()
	a := state.NewDomainPrints(c, prefix, time.Minute)
	for i := 0; i < 5; i++ {
		_ = a.Publish(ctx, []state.DomainBatch{{Domain: "e1", Budget: 1 << 20, Records: []state.DomainRecord{{Tenant: "t", FPs: seqFPs(512*i, 512)}}}})
	}
	b := state.NewDomainPrints(c, prefix, time.Minute)
	b.ReadBytes = 2 * (512*8 + 128)
	var got pulledRecs
	for _, want := range []int{2, 2, 1} {
		n := len(got.recs)
		res := b.Pull(ctx, []string{"e1"}, got.apply)
		if len(got.recs)-n != want || res[0].More != (want == 2) {
			t.Fatalf("read of %d records (more %v), want %d", len(got.recs)-n, res[0].More, want)
		}
	}
	if st := b.State("e1", time.Now()); st.Bootstrapping {
		t.Fatal("bootstrapping after reading to the end")
	}
	// Hold the first Pull inside Redis's round trip; a second one skips the domain.
	hold, held := make(chan struct{}), make(chan struct{})
	slow := redis.NewClient(&redis.Options{Addr: c.(*redis.Client).Options().Addr, DB: c.(*redis.Client).Options().DB})
	t.Cleanup(func() { slow.Close() })
	var once sync.Once
	slow.AddHook(holdHook{func() { once.Do(func() { close(held); <-hold }) }})
	r := state.NewDomainPrints(slow, prefix, time.Minute)
	done := make(chan []state.Pulled)
	go func() { done <- r.Pull(ctx, []string{"e1", "e2"}, func(string, state.DomainRecord) {}) }()
	<-held
	second := r.Pull(ctx, []string{"e1"}, func(string, state.DomainRecord) {})
	close(hold)
	first := <-done
	if !second[0].Busy || first[0].Busy || first[0].Records == 0 || r.Stats().SkippedBusy != 1 {
		t.Fatalf("first %+v second %+v stats %+v", first, second, r.Stats())
	}
}

type holdHook struct{ wait func() }

func (h holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait()
		return next(ctx, cmds)
	}
}

// On a 3-master Redis Cluster: every domain's stream has a slot of its own, never the control
// plane's, and the streams spread over the masters; a master that stops answering (CLIENT
// PAUSE) fails the reads of its domains only (counted, their partitions go stale), and they
// catch up without a gap when it is back.
func TestDomainPrintsOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c, err := state.NewClient(cl.URL, state.ModeCluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	const prefix = "kvgdp:"
	s := state.NewDomainPrints(c, prefix, time.Minute)
	clock := time.Unix(1e9, 0)
	s.Clock = func() time.Time { return clock }
	cc := c.(*redis.ClusterClient)
	control := cc.ClusterKeySlot(ctx, state.Keys{Prefix: prefix}.Incidents()).Val()
	var domains []string
	var batches []state.DomainBatch
	slots := map[int64]bool{}
	for i := 0; i < 24; i++ {
		d := fmt.Sprintf("engine-%d", i)
		domains = append(domains, d)
		batches = append(batches, state.DomainBatch{Domain: d, Budget: 1000, Records: []state.DomainRecord{{Origin: "A", Tenant: "t", FPs: seqFPs(i*100, 50)}}})
		slot := cc.ClusterKeySlot(ctx, s.Key(d)).Val()
		if slot == control {
			t.Fatalf("%s on the control plane's slot %d", s.Key(d), slot)
		}
		slots[slot] = true
	}
	if len(slots) < 20 {
		t.Fatalf("24 domains on %d slots", len(slots))
	}
	if err := s.Publish(ctx, batches); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	count := func(d string, rec state.DomainRecord) { got[d] += len(rec.FPs) }
	for _, r := range s.Pull(ctx, domains, count) {
		if r.Err != nil || got[r.Domain] != 50 {
			t.Fatalf("%+v: %d fingerprints", r, got[r.Domain])
		}
	}
	// Stop the master of engine-0's slot (SIGSTOP: it holds its connections and answers
	// nothing) while reading everything.
	master := masterOf(t, cc, s.Key("engine-0"))
	onPaused := map[string]bool{}
	for _, d := range domains {
		onPaused[d] = masterOf(t, cc, s.Key(d)) == master
	}
	pauser := redis.NewClient(&redis.Options{Addr: master})
	t.Cleanup(func() { pauser.Close() })
	info, err := pauser.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, pidText, _ := strings.Cut(info, "process_id:")
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(pidText, "\n", 2)[0]))
	if pid == 0 || syscall.Kill(pid, syscall.SIGSTOP) != nil {
		t.Fatalf("stopping the master %s (pid %d)", master, pid)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	clock = clock.Add(time.Minute) // the reads during the stop are a minute after the last good one
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	res := s.Pull(tctx, domains, count)
	cancel()
	failed := 0
	for _, r := range res {
		if (r.Err != nil) != onPaused[r.Domain] {
			t.Fatalf("%s (on the paused master %v): err %v", r.Domain, onPaused[r.Domain], r.Err)
		}
		if r.Err != nil {
			failed++
		}
	}
	if failed == 0 || s.Stats().ReadErrors != uint64(failed) {
		t.Fatalf("%d reads failed, stats %+v", failed, s.Stats())
	}
	if !s.State("engine-0", clock).Stale || s.State(firstNotOn(onPaused), clock).Stale {
		t.Fatal("staleness: want the stopped master's domain stale, the others not")
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	waitUnpaused(t, pauser)
	_ = s.Publish(ctx, batches)
	for _, r := range s.Pull(ctx, domains, count) {
		if r.Err != nil || r.Gap != 0 || got[r.Domain] != 100 {
			t.Fatalf("after the pause: %+v, %d fingerprints", r, got[r.Domain])
		}
	}
	if s.State("engine-0", clock).Stale {
		t.Fatal("still stale after a good read")
	}
}

func masterOf(t *testing.T, cc *redis.ClusterClient, key string) string {
	t.Helper()
	var addr string
	err := cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		slot := cc.ClusterKeySlot(ctx, key).Val()
		slots, err := m.ClusterSlots(ctx).Result()
		if err != nil {
			return err
		}
		for _, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) && s.Nodes[0].Addr == m.Options().Addr {
				addr = m.Options().Addr
			}
		}
		return nil
	})
	if err != nil || addr == "" {
		t.Fatalf("master of %s: %v", key, err)
	}
	return addr
}

// waitUnpaused waits for the stopped master to answer again.
func waitUnpaused(t *testing.T, c *redis.Client) {
	t.Helper()
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i > 100 {
			t.Fatal("the paused master does not answer")
		}
	}
}

func firstNotOn(paused map[string]bool) string {
	for d, p := range paused {
		if !p {
			return d
		}
	}
	return ""
}
