package state_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/fingerprint"
	"github.com/kvgate/kvgate/fingerprint/fptest"
	"github.com/kvgate/kvgate/state"
)

// The partitioned index, shared through the per-domain streams, against the reference: one
// trace (fixed seed) of prompts and replies over 16 in-process replicas, 64 engines (16
// prefill and 16 decode engines routed in random pairs, 32 single engines), 200 tenants and
// over 1,000 leaks (a reply quoting another tenant's earlier prompt, of any age in the trace,
// on a route sharing an engine with it), replayed through each replica's fingerprint.Domains,
// which learn the other replicas' prompts from real Redis streams only, and through one
// fingerprint.Index that sees every prompt: every reply is cut by both or by neither, with the
// same victim. Also in the trace: quotes of prompts on routes that never held them, of the
// requester's own earlier prompts, and text no one sent (cut by neither).
func TestPartitionedIndexMatchesReference(t *testing.T) {
	c, prefix := testRedis(t)
	st := runTrace(t, c, prefix, traceSpec{seed: 38, replicas: 16, tenants: 200, steps: 70, prompts: 24, replies: 20, leakShare: 0.8})
	if st.leaks < 1000 || st.refCuts < st.leaks || st.mismatches != 0 {
		t.Fatalf("%+v", st)
	}
	t.Logf("%+v", st)
}

// The benign variant: 60 tenants share text (each shared document sent by 3 to 6 of them, on
// random routes over the 64 engines) besides their own; any of them asking for a shared
// document or quoting its own prompts raises no incident in either index.
func TestSharedTextOverManyEnginesRaisesNothing(t *testing.T) {
	c, prefix := testRedis(t)
	st := runTrace(t, c, prefix, traceSpec{seed: 60, replicas: 16, tenants: 60, steps: 30, prompts: 24, replies: 20, shared: 40})
	if st.refCuts != 0 || st.partCuts != 0 || st.replies < 500 {
		t.Fatalf("%+v", st)
	}
	t.Logf("%+v", st)
}

type traceSpec struct {
	seed                                       uint64
	replicas, tenants, steps, prompts, replies int
	leakShare                                  float64 // of replies
	shared                                     int     // shared documents (benign variant)
}

type traceStats struct {
	prompts, replies, leaks, refCuts, partCuts, mismatches int
	published, applied                                     int
	firstMismatch                                          string
}

type replica struct {
	name  string
	dom   *fingerprint.Domains
	feed  *state.DomainPrints
	queue map[string][]state.DomainRecord
}

type sentPrompt struct {
	tenant string
	route  []string
	text   string
}

func runTrace(t *testing.T, c redis.UniversalClient, prefix string, spec traceSpec) traceStats {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(spec.seed, 38))
	secret := []byte("differential-secret")
	h := fingerprint.NewHasher(secret)
	const ttl = 24 * time.Hour
	ref := fingerprint.NewIndex(h, fingerprint.Config{MaxBytes: 1 << 40, TTL: ttl})
	var engines []string
	for i := 0; i < 16; i++ {
		engines = append(engines, fmt.Sprintf("p%d", i), fmt.Sprintf("d%d", i))
	}
	for i := 0; i < 32; i++ {
		engines = append(engines, fmt.Sprintf("u%d", i))
	}
	pools := map[string]int64{}
	for _, e := range engines {
		pools[e] = int64(256<<10 + rng.IntN(768<<10)) // 256k–1M tokens: the trace fits every pool
	}
	reps := make([]*replica, spec.replicas)
	for i := range reps {
		r := &replica{name: fmt.Sprintf("r%d", i), dom: fingerprint.NewDomains(fingerprint.NewHasher(secret), fingerprint.DomainsConfig{TTL: ttl}),
			feed: state.NewDomainPrints(c, prefix, ttl), queue: map[string][]state.DomainRecord{}}
		for _, e := range engines {
			r.dom.SetPool(e, pools[e])
		}
		reps[i] = r
	}
	route := func() []string {
		if rng.IntN(2) == 0 {
			return []string{fmt.Sprintf("p%d", rng.IntN(16)), fmt.Sprintf("d%d", rng.IntN(16))}
		}
		return []string{fmt.Sprintf("u%d", rng.IntN(32))}
	}
	// overlapping is a route sharing at least one engine with r; disjoint one sharing none.
	overlapping := func(r []string) []string {
		if len(r) == 1 {
			return r
		}
		switch rng.IntN(3) {
		case 0:
			return []string{r[0], fmt.Sprintf("d%d", rng.IntN(16))}
		case 1:
			return []string{fmt.Sprintf("p%d", rng.IntN(16)), r[1]}
		}
		return r
	}
	disjoint := func(r []string) []string {
		for {
			o := route()
			if !slices.ContainsFunc(o, func(e string) bool { return slices.Contains(r, e) }) {
				return o
			}
		}
	}
	tenant := func() string { return fmt.Sprintf("t%d", rng.IntN(spec.tenants)) }
	var st traceStats
	var sent []sentPrompt
	docs := make([]string, spec.shared)
	for i := range docs {
		docs[i] = fptest.Words(rng, 80+rng.IntN(120))
	}
	now := time.Unix(1_800_000_000, 0)
	send := func(p sentPrompt, at time.Time) {
		fps, _ := h.Prompt(p.text)
		ref.Record(p.tenant, p.route, slices.Clone(fps), at)
		r := reps[rng.IntN(len(reps))]
		for i, fresh := range r.dom.Record(p.tenant, p.route, fps, at) {
			if len(fresh) > 0 {
				r.queue[p.route[i]] = append(r.queue[p.route[i]], state.DomainRecord{Origin: r.name, Tenant: p.tenant, At: at, FPs: fresh})
			}
		}
		sent = append(sent, p)
		st.prompts++
	}
	share := func() {
		for _, r := range reps {
			var batches []state.DomainBatch
			for d, recs := range r.queue {
				batches = append(batches, state.DomainBatch{Domain: d, Budget: r.dom.Budget(pools[d]), Records: recs})
				for _, rec := range recs {
					st.published += len(rec.FPs)
				}
			}
			clear(r.queue)
			if err := r.feed.Publish(ctx, batches); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range reps {
			for more := true; more; {
				more = false
				for _, p := range r.feed.Pull(ctx, engines, func(d string, rec state.DomainRecord) {
					if rec.Origin != r.name {
						r.dom.Apply(rec.Tenant, d, rec.FPs, rec.At)
						st.applied += len(rec.FPs)
					}
				}) {
					if p.Err != nil || p.Gap != 0 || p.Busy {
						t.Fatalf("%s: %+v", r.name, p)
					}
					more = more || p.More
				}
			}
		}
	}
	for step := 0; step < spec.steps; step++ {
		at := now.Add(time.Duration(step) * time.Minute)
		for i := 0; i < spec.prompts; i++ {
			text := fptest.Words(rng, 40+rng.IntN(200))
			if spec.shared > 0 && rng.IntN(3) == 0 { // a shared document inside a question of its own
				text = fptest.Words(rng, 10) + " " + docs[rng.IntN(len(docs))] + " " + fptest.Words(rng, 10)
			}
			send(sentPrompt{tenant: tenant(), route: route(), text: text}, at)
		}
		if step == 0 {
			for i, doc := range docs { // every shared document by 3 to 6 distinct tenants
				for _, k := range rng.Perm(spec.tenants)[:3+rng.IntN(4)] {
					send(sentPrompt{tenant: fmt.Sprintf("t%d", k), route: route(), text: fptest.Words(rng, 5) + fmt.Sprint(i) + " " + doc}, at)
				}
			}
		}
		share()
		for i := 0; i < spec.replies; i++ {
			requester, rt, reply, leak := tenant(), route(), "", false
			question := fptest.Words(rng, 30)
			v := sent[rng.IntN(len(sent))] // any age inside the trace: all of it is retained
			chunk := func(s string) string {
				start := rng.IntN(max(1, len(s)-200))
				return s[start:min(len(s), start+200)]
			}
			switch x := rng.Float64(); {
			case spec.shared > 0 && x < 0.5:
				reply = chunk(docs[rng.IntN(len(docs))])
			case spec.shared > 0:
				mine := sent[rng.IntN(len(sent))]
				requester, rt, reply = mine.tenant, overlapping(mine.route), chunk(mine.text)
			case x < spec.leakShare && v.tenant != requester:
				rt, reply, leak = overlapping(v.route), chunk(v.text), true
			case x < spec.leakShare+0.07:
				rt, reply = disjoint(v.route), chunk(v.text)
			case x < spec.leakShare+0.14:
				requester, rt, reply = v.tenant, overlapping(v.route), chunk(v.text)
			default:
				reply = fptest.Words(rng, 40)
			}
			_, own := h.Prompt(question)
			rs := ref.NewScanner(requester, rt, own)
			rcut := rs.Feed(reply)
			ps := reps[rng.IntN(len(reps))].dom.NewScanner(requester, rt, own)
			pcut := ps.Feed(reply)
			st.replies++
			if leak {
				st.leaks++
			}
			if rcut {
				st.refCuts++
			}
			if pcut {
				st.partCuts++
			}
			if rcut != pcut || rs.Victim() != ps.Victim() {
				st.mismatches++
				if st.firstMismatch == "" {
					st.firstMismatch = fmt.Sprintf("step %d: %s on %v: reference cut %v victim %q, partitioned cut %v victim %q (leak %v)", step, requester, rt, rcut, rs.Victim(), pcut, ps.Victim(), leak)
				}
			}
		}
	}
	for _, r := range reps {
		for _, p := range r.dom.Stats(now).Partitions {
			if p.Evicted != 0 {
				t.Fatalf("%s evicted %d fingerprints of %s: the trace is not inside retention", r.name, p.Evicted, p.Domain)
			}
		}
	}
	return st
}
