package leakwatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/redistest"
)

// A reply is checked against every prompt published to the shared stream before the reply's
// own prompt record: with the publisher stopped, the reply waits (bounded) and then reads the
// stream itself; with it running, its own record's publish reads the stream back and the reply
// reads nothing.
func TestReplyWaitsForSharedPrints(t *testing.T) {
	cfg, err := config.Parse([]byte(`
backends: [{name: sim, url: "http://127.0.0.1:9", role: unified}]
tenants:
  - {name: alice, key_sha256: "`+config.SHA256Hex("a")+`"}
  - {name: bob, key_sha256: "`+config.SHA256Hex("b")+`"}
canary: {enabled: true, secret: "inmem test secret, padded to 32 bytes"}
capacity: {poll_interval: 1h}
state: {redis_url: "`+redistest.URL()+`", key_prefix: "kvgate-test-await-`+newID()+`:"}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	g, st := redisWatcher(t, cfg)
	// publishVictim writes bob's prompt as another replica would.
	publishVictim := func(text string) {
		fps, _ := g.prints.Hasher().Prompt(text)
		if err := st.Prints.Publish(context.Background(), state.PrintsRecord{Origin: "another-replica", Tenant: "bob", Backends: []string{"sim"}, At: time.Now(), FPs: fps}); err != nil {
			t.Fatal(err)
		}
	}
	caught := func(text string) bool {
		return g.prints.NewScanner("alice", []string{"sim"}, nil).Feed(text)
	}
	aliceAsks := func() *Watch {
		x := &Watch{w: g, tenant: "alice", backends: []string{"sim"}}
		x.fp.text = "alice asks about the weather in a few words of her own"
		return x
	}
	victim1 := strings.Repeat("bob's first private prompt, about the quarterly numbers nobody else may read. ", 8)
	victim2 := strings.Repeat("bob's second private prompt, a medical history that must stay his alone. ", 8)

	// Nothing runs: alice's record is queued but never published.
	publishVictim(victim1)
	x := aliceAsks()
	x.notePrompt()
	if x.fp.seq == 0 || caught(victim1) {
		t.Fatalf("seq %d, caught before the wait: %v", x.fp.seq, caught(victim1))
	}
	began := time.Now()
	x.awaitPrints()
	if waited := time.Since(began); waited < printsWait || !caught(victim1) || lateReads(g) != 1 {
		t.Fatalf("after %v: caught %v, catch-up reads %v; want the bounded wait, then one read", waited, caught(victim1), lateReads(g))
	}

	// Running: the reply waits for its own record's publish, which read the stream back.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.Run(ctx)
	publishVictim(victim2)
	x = aliceAsks()
	x.notePrompt()
	x.awaitPrints()
	if !caught(victim2) || lateReads(g) != 1 {
		t.Fatalf("caught %v, catch-up reads %v; want caught with no read of its own", caught(victim2), lateReads(g))
	}
}

// redisWatcher is a replica's Watcher on the shared store of cfg.
func redisWatcher(t *testing.T, cfg *config.Config) (*Watcher, *state.State) {
	t.Helper()
	st, err := state.Open(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return New(Options{Canary: cfg.Canary, Tenants: []string{"alice", "bob"}, State: st, Quarantine: func(map[string]time.Time) {},
		Registry: prometheus.NewRegistry(), Log: zap.NewNop(), Background: func(_ string, work func(context.Context)) { work(context.Background()) }}), st
}

// lateReads is kvgate_fingerprint_catchup_reads_total.
func lateReads(g *Watcher) float64 {
	var d dto.Metric
	_ = g.printsWaitLate.Write(&d)
	return d.GetCounter().GetValue()
}
