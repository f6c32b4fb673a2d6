package fingerprint

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

func newTestDomains(cfg DomainsConfig) *Domains { return NewDomains(NewHasher(secret), cfg) }

func keepIn(d *Domains, tenant string, domains []string, text string, at time.Time) *Own {
	fps, own := d.Hasher().Prompt(text)
	d.Record(tenant, domains, fps, at)
	return own
}

func leaks(d *Domains, requester string, route []string, reply string) (bool, string) {
	sc := d.NewScanner(requester, route, nil)
	return sc.Feed(reply), sc.Victim()
}

// The Index's verdict rule, partition by partition: the requester's own text, text three
// tenants sent (on any engines) and text sent only to engines off the reply's route are no
// evidence; another tenant's text on the route is, and a PD route reads both its partitions.
func TestDomainsVerdicts(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := newTestDomains(DomainsConfig{CutMatches: 1, CommonTenants: 3})
	shared, licence, other, earlier, aOnly, onDecode := words(10, 200), words(11, 200), words(12, 200), words(13, 200), words(14, 200), words(15, 200)
	keepIn(d, "a", []string{"u0"}, shared+" "+earlier+" "+aOnly, now)
	for i, n := range []string{"a", "b", "c"} {
		keepIn(d, n, []string{fmt.Sprintf("e%d", i)}, licence, now) // common across partitions
	}
	keepIn(d, "d", []string{"u1"}, other, now)
	keepIn(d, "z", []string{"u0"}, earlier, now)
	keepIn(d, "e", []string{"p7", "d7"}, onDecode, now)
	own := keepIn(d, "z", []string{"u0"}, "my question: "+shared, now)
	for name, reply := range map[string]string{"own prompt": shared, "boilerplate": licence, "other engine": other, "earlier own prompt": earlier} {
		sc := d.NewScanner("z", []string{"u0"}, own)
		if sc.Feed(reply) || sc.Count() != 0 {
			t.Errorf("%s: %d matches, leak %v", name, sc.Count(), sc.Leak())
		}
	}
	if cut, victim := leaks(d, "y", []string{"u0"}, aOnly); !cut || victim != "a" {
		t.Fatalf("a's text in y's reply: cut %v victim %q", cut, victim)
	}
	for _, route := range [][]string{{"p7", "d7"}, {"d7"}, {"p7"}, {"x", "d7"}} {
		if cut, victim := leaks(d, "y", route, onDecode); !cut || victim != "e" {
			t.Fatalf("e's text on route %v: cut %v victim %q", route, cut, victim)
		}
	}
	if cut, _ := leaks(d, "y", []string{"p8", "d8"}, onDecode); cut {
		t.Fatal("e's text cut on a route that never held it")
	}
}

// One engine's traffic never evicts another's: a victim's 32k-token prompt on e1 is caught
// after 10,000 later 32k-token prompts on 64 other engines (their fingerprints drawn at random:
// distinct text; each engine's budget turned over about 100 times), and after 2 × e1's pool of later distinct text on e1 itself; past its
// budget e1 forgets it, and says so (EvictedYoung).
func TestVictimOutlivesOtherEnginesTraffic(t *testing.T) {
	now := time.Unix(1e9, 0)
	const pool = 48 << 10 // tokens
	d := newTestDomains(DomainsConfig{CutMatches: 3, TTL: 24 * time.Hour})
	d.SetPool("e1", pool)
	for e := 0; e < 64; e++ {
		d.SetPool(fmt.Sprintf("o%d", e), 8<<10) // small pools: the table stays in cache, the test quick
	}
	victim := words(1, 32<<10*4/55*10) // ~32k tokens at 4 bytes a token
	keepIn(d, "victim", []string{"e1"}, victim, now)
	quote := victim[len(victim)/2 : len(victim)/2+400]
	caught := func() bool { cut, who := leaks(d, "thief", []string{"e1"}, quote); return cut && who == "victim" }
	if !caught() {
		t.Fatal("the victim's prompt is not caught at once")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	perPrompt := 12583 // 32k tokens × FingerprintsPerToken
	fps := make([]uint64, perPrompt)
	for i := 0; i < 10000; i++ {
		for j := range fps {
			fps[j] = rng.Uint64()
		}
		d.Apply(fmt.Sprintf("t%d", i%300), fmt.Sprintf("o%d", i%64), fps, now.Add(time.Duration(i)*time.Millisecond))
	}
	if !caught() {
		t.Fatal("10,000 prompts on other engines evicted the victim's prompt on e1")
	}
	// 2 × e1's pool of later distinct text on e1 (4 bytes a token), in 8k-token prompts.
	at := now.Add(time.Hour)
	for sent, i := 0, 0; sent < 2*pool*4; i++ {
		text := words(uint64(1000+i), 8<<10*4*10/55)
		keepIn(d, fmt.Sprintf("u%d", i%50), []string{"e1"}, text, at)
		sent += len(text)
	}
	if !caught() {
		t.Fatal("2 × the pool of later text on e1 evicted the victim's prompt")
	}
	st := d.Stats(at)
	for _, p := range st.Partitions {
		if p.Fingerprints > p.Budget*(generations)/(generations-1)+1 {
			t.Fatalf("partition %s holds %d fingerprints over its budget %d", p.Domain, p.Fingerprints, p.Budget)
		}
	}
	// Far past its budget, e1 forgets the victim, and counts what it dropped inside the window.
	for i := 0; i < 40; i++ {
		keepIn(d, "u", []string{"e1"}, words(uint64(5000+i), 8<<10*4*10/55), at)
	}
	if caught() {
		t.Fatal("still caught past 5 × the budget: retention is not bounded")
	}
	for _, p := range d.Stats(at).Partitions {
		if p.Domain == "e1" && (p.EvictedYoung == 0 || p.OldestAge != 0) {
			t.Fatalf("e1 %+v: want young evictions counted, oldest age 0 (all at one time)", p)
		}
	}
}

// A prompt sent again refreshes its entries (no copies) and stays while other text flows.
func TestResentPromptRefreshes(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := newTestDomains(DomainsConfig{})
	d.SetPool("e1", 8<<10)
	prefix := words(2, 1000)
	keepIn(d, "a", []string{"e1"}, prefix, now)
	n := d.Stats(now).Partitions[0].Fingerprints
	for i := 0; i < 20; i++ {
		fps, _ := d.Hasher().Prompt(prefix)
		if fresh := d.Record("a", []string{"e1"}, fps, now); len(fresh[0]) != 0 && i < 2 {
			t.Fatalf("re-sent prompt %d: %d fingerprints to publish, want 0", i, len(fresh[0]))
		}
		keepIn(d, "b", []string{"e1"}, words(uint64(100+i), 1000), now)
		if cut, _ := leaks(d, "c", []string{"e1"}, prefix[:300]); !cut {
			t.Fatalf("after %d other prompts the re-sent prefix is gone", i+1)
		}
	}
	if st := d.Stats(now); st.Partitions[0].Fingerprints > st.Partitions[0].Budget*generations/(generations-1)+1 || n == 0 {
		t.Fatalf("stats %+v (first prompt: %d)", st, n)
	}
}

// Past the detect window a partition's text is forgotten (Prune for idle ones).
func TestDomainsForgetPastTheWindow(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := newTestDomains(DomainsConfig{TTL: time.Hour, CutMatches: 1})
	text := words(3, 300)
	keepIn(d, "a", []string{"e1"}, text, now)
	d.Prune(now.Add(59 * time.Minute))
	if cut, _ := leaks(d, "b", []string{"e1"}, text); !cut {
		t.Fatal("forgotten inside the window")
	}
	if age := d.Stats(now.Add(59 * time.Minute)).Partitions[0].OldestAge; age != 59*time.Minute {
		t.Fatalf("oldest retained age %v, want 59m", age)
	}
	d.Prune(now.Add(61 * time.Minute))
	if cut, _ := leaks(d, "b", []string{"e1"}, text); cut {
		t.Fatal("kept past the window")
	}
	if st := d.Stats(now.Add(61 * time.Minute)); st.Partitions[0].Fingerprints != 0 || st.Partitions[0].EvictedYoung != 0 {
		t.Fatalf("past the window: %+v", st.Partitions[0])
	}
}

// Replies are scanned while prompts are recorded and shards rebuilt (run with -race): every
// scan of a prompt recorded before it began is a cut.
func TestDomainsScanWhileRecording(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := newTestDomains(DomainsConfig{})
	d.SetPool("e1", 1<<20)
	victim := words(4, 500)
	keepIn(d, "victim", []string{"e1"}, victim, now)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			keepIn(d, fmt.Sprintf("w%d", i%7), []string{"e1", "e2"}, words(uint64(200+i), 300), now)
		}
	}()
	for i := 0; i < 300; i++ {
		if cut, who := leaks(d, "thief", []string{"e1"}, victim[100:400]); !cut || who != "victim" {
			t.Errorf("scan %d: cut %v victim %q", i, cut, who)
			break
		}
	}
	close(stop)
	wg.Wait()
}

func TestParseKeying(t *testing.T) {
	for in, want := range map[string]Keying{"": ByEngine, "engine": ByEngine, "group": ByGroup, "model": ByModel} {
		if k, err := ParseKeying("f", in); err != nil || k != want {
			t.Fatalf("%q: %v %v", in, k, err)
		}
	}
	if _, err := ParseKeying("canary.fingerprints.partition_by", "rack"); err == nil || err.Error() != `canary.fingerprints.partition_by: "rack" is not one of engine, group, model` {
		t.Fatalf("bad keying: %v", err)
	}
	if ByGroup.Domain("e1", "g", "m") != "group:g" || ByGroup.Domain("e1", "", "m") != "e1" || ByModel.Domain("e1", "g", "m") != "model:m" || ByEngine.Domain("e1", "g", "m") != "e1" {
		t.Fatal("Domain keys")
	}
}

// Nothing silent: a reply scanned against a route with an incomplete partition is counted, the
// reasons are counted per partition, and clearing them stops the count.
func TestIncompletePartitionsAreCounted(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := newTestDomains(DomainsConfig{})
	keepIn(d, "a", []string{"e1"}, words(1, 100), now)
	keepIn(d, "a", []string{"e2"}, words(2, 100), now)
	d.SetIncomplete("e1", Bootstrapping|Gapped)
	d.SetIncomplete("e3", Stale)
	d.NewScanner("b", []string{"e2"}, nil)
	d.NewScanner("b", []string{"p9", "e1"}, nil)
	st := d.Stats(now)
	if st.ScannedIncomplete != 1 || st.Bootstrapping != 1 || st.Gapped != 1 || st.Stale != 1 {
		t.Fatalf("stats %+v", st)
	}
	d.SetIncomplete("e1", 0)
	d.NewScanner("b", []string{"e1"}, nil)
	if st := d.Stats(now); st.ScannedIncomplete != 1 || st.Bootstrapping != 0 {
		t.Fatalf("after clearing: %+v", st)
	}
	if st.Public == 0 || st.TableBytes == 0 {
		t.Fatalf("public text %d, table %d B", st.Public, st.TableBytes)
	}
}

// Every kept fingerprint is found after the shards grew and were rebuilt many times (out of
// order entries included), and none evicted is.
func TestDomainsTableFindsEveryLiveEntry(t *testing.T) {
	now := time.Unix(1e9, 0)
	d := newTestDomains(DomainsConfig{NoShippedPublicText: true})
	d.SetPool("big", 1<<22)
	d.SetPool("small", 1<<10)
	rng := rand.New(rand.NewPCG(9, 9))
	var kept, churn []uint64
	for i := 0; i < 200; i++ {
		batch := make([]uint64, 1000)
		for j := range batch {
			batch[j] = rng.Uint64()
		}
		d.Apply(fmt.Sprintf("t%d", i%5), "big", batch, now)
		kept = append(kept, batch...)
		for j := range batch {
			batch[j] = rng.Uint64()
		}
		d.Apply("churn", "small", batch, now) // fills and evicts all along: dead entries to reclaim
		churn = append(churn, batch[:100]...)
	}
	p := &path{parts: []uint16{firstDomainPart, firstDomainPart + 1}}
	for i, fp := range kept {
		if vd, victim := d.verdict(fp, 0, p); vd != foreign || d.name(victim) != fmt.Sprintf("t%d", i/1000%5) {
			t.Fatalf("fingerprint %d of %d: verdict %d victim %q", i, len(kept), vd, d.name(victim))
		}
	}
	for i, fp := range churn[:len(churn)-2000] {
		if vd, _ := d.verdict(fp, 0, p); vd != unknown {
			t.Fatalf("evicted fingerprint %d still found (%d)", i, vd)
		}
	}
}
