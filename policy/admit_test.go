package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// The incident's numbers: context 1,048,576, prefill pool 681,280 → mril = min(ctx-1, pool-1)-5.
var incident = Path{MaxReqInputLen: 681280 - 1 - 5, ContextLen: 1048576, PoolTokens: 681280}

func TestMaxPromptAgreesWithTheRuleAtEveryBoundary(t *testing.T) {
	paths := []Path{
		incident,
		{MaxReqInputLen: 20474, ContextLen: 32768, PoolTokens: 20480},
		{MaxReqInputLen: 32762, ContextLen: 32768, PoolTokens: 1 << 20},
		{MaxReqInputLen: 100, ContextLen: 100, PoolTokens: 100},
		{MaxReqInputLen: 10, ContextLen: 5, PoolTokens: 64},
		// Inconsistent readings: the limits say more than the pool holds (issue 15's engine).
		{MaxReqInputLen: 100000, ContextLen: 100000, PoolTokens: 4006},
		{MaxReqInputLen: 5000, ContextLen: 8192, PoolTokens: 4096},
		{MaxReqInputLen: 50, ContextLen: 100, PoolTokens: 0},
		// Pages: the scheduler's reservation binds below max_req_input_len (sglang#39271).
		{MaxReqInputLen: 190778, ContextLen: 262144, PoolTokens: 190784, PageSize: 64},
		{MaxReqInputLen: 2042, ContextLen: 8192, PoolTokens: 2048, PageSize: 16},
		{MaxReqInputLen: 2042, ContextLen: 8192, PoolTokens: 2048, PageSize: 1},
		{MaxReqInputLen: 4000, ContextLen: 8192, PoolTokens: 2048, PageSize: 4096},
		// A pair's decode preallocates only while P + num_reserved_decode_tokens fits its pool.
		{MaxReqInputLen: 2042, ContextLen: 8192, PoolTokens: 2048, PageSize: 16, DecodePool: 2048, DecodeReserve: 512},
		{MaxReqInputLen: 4090, ContextLen: 8192, PoolTokens: 4096, PageSize: 16, DecodePool: 8192, DecodeReserve: 512},
		{MaxReqInputLen: 4090, ContextLen: 8192, PoolTokens: 4096, PageSize: 1, DecodePool: 4096, DecodeReserve: 0},
	}
	for _, p := range paths {
		for _, out := range []int{0, 1, 127, 128, 1000, p.ContextLen - 1, p.ContextLen, p.ContextLen + 5} {
			for _, cap := range []int{0, 1, 50, 20473, 20474} {
				m := MaxPrompt(p, out, cap)
				// Probe around every boundary: the limit itself and its neighbours.
				for _, prompt := range []int{0, 1, m - 1, m, m + 1, p.MaxReqInputLen - 1, p.MaxReqInputLen, p.ContextLen - out - 1, p.ContextLen - out,
					p.PoolTokens, p.PoolTokens + 1, p.PoolTokens - p.PageSize - 1, p.PoolTokens - p.PageSize,
					p.DecodePool - p.DecodeReserve, p.DecodePool - p.DecodeReserve + 1, cap, cap + 1} {
					if prompt < 0 {
						continue
					}
					want := Admits(p, prompt, out, cap)
					got := prompt <= m
					if got != want {
						t.Fatalf("path %+v out=%d cap=%d prompt=%d: MaxPrompt=%d says %v, rule says %v", p, out, cap, prompt, m, got, want)
					}
				}
			}
		}
	}
}

func TestAdmitsBoundaries(t *testing.T) {
	p := Path{MaxReqInputLen: 20474, ContextLen: 32768, PoolTokens: 20480}
	cases := []struct {
		name             string
		prompt, out, cap int
		want             bool
	}{
		{"one below mril", 20473, 0, 0, true},
		{"at mril: the engine rejects P ≥ mril", 20474, 0, 0, false},
		{"P+O one below ctx", 20000, 12767, 0, true},
		{"P+O equals ctx: strict form refuses", 20000, 12768, 0, false},
		{"tenant cap equal admits (≤)", 500, 0, 500, true},
		{"tenant cap exceeded", 501, 0, 500, false},
		{"cap 0 means none", 20473, 0, 0, true},
	}
	for _, tc := range cases {
		if got := Admits(p, tc.prompt, tc.out, tc.cap); got != tc.want {
			t.Errorf("%s: Admits=%v want %v", tc.name, got, tc.want)
		}
	}
	if got := MaxPrompt(incident, 0, 0); got != 681273 {
		t.Errorf("incident limit: got %d want 681273", got)
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		est   int
		r     float64
		limit int
		want  Zone
	}{
		{100, 1.3, 130, ZoneAdmit},
		{100, 1.3, 129, ZoneGray},
		{130, 1.3, 100, ZoneGray},
		{131, 1.3, 100, ZoneRefuse},
		{100, 1.0, 100, ZoneAdmit},
		{101, 1.0, 100, ZoneRefuse},
	}
	for _, tc := range cases {
		if got := Classify(tc.est, tc.r, tc.limit); got != tc.want {
			t.Errorf("Classify(%d, %v, %d) = %v want %v", tc.est, tc.r, tc.limit, got, tc.want)
		}
	}
}

// wordEstimator counts space-separated words and records how far it was asked to count.
type wordEstimator struct{ stopAfter []int }

func (w *wordEstimator) Count(text string, stopAfter int) (int, bool) {
	w.stopAfter = append(w.stopAfter, stopAfter)
	n := len(strings.Fields(text))
	if stopAfter >= 0 && n > stopAfter {
		return stopAfter + 1, false
	}
	return n, true
}

type fixedExact struct {
	n     int
	err   error
	calls int
}

func (f *fixedExact) Exact(context.Context, string) (int, error) { f.calls++; return f.n, f.err }

func TestDecideTiers(t *testing.T) {
	words := func(n int) string { return strings.Repeat("word ", n) } // 5 bytes per word
	cases := []struct {
		name      string
		req       Request
		limit     int
		exact     *fixedExact
		wantAdmit bool
		wantTier  Tier
		wantCalls int
	}{
		{"input ids fit", Request{InputIDs: 10, HasInputIDs: true}, 10, nil, true, TierInputIDs, 0},
		{"input ids over", Request{InputIDs: 11, HasInputIDs: true}, 10, nil, false, TierInputIDs, 0},
		{"byte bound admits", Request{Text: words(10), Bytes: 50}, 50, nil, true, TierBound, 0},
		{"estimate admits", Request{Text: words(100), Bytes: 500}, 130, &fixedExact{}, true, TierEstimate, 0},
		{"estimate refuses", Request{Text: words(200), Bytes: 1000}, 100, &fixedExact{}, false, TierEstimate, 0},
		{"gray zone asks exact: fits", Request{Text: words(100), Bytes: 500}, 110, &fixedExact{n: 110}, true, TierExact, 1},
		{"gray zone asks exact: over", Request{Text: words(100), Bytes: 500}, 110, &fixedExact{n: 111}, false, TierExact, 1},
		{"gray zone, exact unavailable: undecided", Request{Text: words(100), Bytes: 500}, 110, &fixedExact{err: errors.New("busy")}, false, TierUnavailable, 1},
		{"gray zone, no exact counter: undecided", Request{Text: words(100), Bytes: 500}, 110, nil, false, TierUnavailable, 0},
		{"exact 0 is no count", Request{Text: words(100), Bytes: 500}, 110, &fixedExact{n: 0}, false, TierUnavailable, 1},
		{"exact negative is no count", Request{Text: words(100), Bytes: 500}, 110, &fixedExact{n: -100000}, false, TierUnavailable, 1},
		{"exact above the byte bound is no count", Request{Text: words(100), Bytes: 500}, 110, &fixedExact{n: 503}, false, TierUnavailable, 1},
		{"exact at the byte bound + overhead counts", Request{Text: words(100), Bytes: 500, Overhead: 2}, 110, &fixedExact{n: 502}, false, TierExact, 1},
		{"distrusted, admit zone, exact fits", Request{Text: words(100), Bytes: 500, DistrustEstimate: true}, 130, &fixedExact{n: 129}, true, TierExact, 1},
		{"distrusted, admit zone, exact down: undecided", Request{Text: words(100), Bytes: 500, DistrustEstimate: true}, 130, &fixedExact{err: errors.New("404")}, false, TierUnavailable, 1},
		{"distrusted, refuse zone: the estimate still refuses", Request{Text: words(200), Bytes: 1000, DistrustEstimate: true}, 100, &fixedExact{}, false, TierEstimate, 0},
		{"nothing fits", Request{Text: words(3), Bytes: 15}, -5, nil, false, TierEstimate, 0},
		// Fail-closed after count drift: only token ids admit; no engine is asked.
		{"fail-closed: the byte bound does not admit", Request{Text: words(10), Bytes: 50, FailClosed: true}, 50, &fixedExact{n: 12}, false, TierUnavailable, 0},
		{"fail-closed: an estimate does not admit", Request{Text: words(100), Bytes: 500, FailClosed: true}, 130, &fixedExact{n: 100}, false, TierUnavailable, 0},
		{"fail-closed: a local count that fits does not admit", Request{Text: words(10), Bytes: 50, LocalExact: true, FailClosed: true}, 50, nil, false, TierUnavailable, 0},
		{"fail-closed: a local count still refuses", Request{Text: words(100), Bytes: 500, LocalExact: true, FailClosed: true}, 50, nil, false, TierLocal, 0},
		{"fail-closed: token ids are exact", Request{InputIDs: 10, HasInputIDs: true, FailClosed: true}, 10, nil, true, TierInputIDs, 0},
		{"fail-closed: the estimate still refuses", Request{Text: words(200), Bytes: 1000, FailClosed: true}, 100, &fixedExact{}, false, TierEstimate, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ex ExactCounter
			if tc.exact != nil {
				ex = tc.exact
			}
			d := Decide(context.Background(), tc.req, tc.limit, &wordEstimator{}, 1.3, ex)
			if d.Admit != tc.wantAdmit || d.Tier != tc.wantTier {
				t.Fatalf("got %+v, want admit=%v tier=%s", d, tc.wantAdmit, tc.wantTier)
			}
			if tc.exact != nil && tc.exact.calls != tc.wantCalls {
				t.Fatalf("exact called %d times, want %d", tc.exact.calls, tc.wantCalls)
			}
			if d.Undecided != (d.Tier == TierUnavailable) || d.Undecided && d.Admit {
				t.Fatalf("undecided must be exactly the unavailable tier, and never admit: %+v", d)
			}
			if d.Admit && d.Tokens > tc.limit {
				t.Fatalf("admitted with tokens %d over limit %d", d.Tokens, tc.limit)
			}
		})
	}
}

func TestDecideStopsEarly(t *testing.T) {
	est := &wordEstimator{}
	d := Decide(context.Background(), Request{Text: strings.Repeat("w ", 100000), Bytes: 200000}, 1000, est, 1.3, nil)
	if d.Admit || len(est.stopAfter) != 1 || est.stopAfter[0] != 1301 {
		t.Fatalf("want a refusal after counting to limit×r+1=1301, got %+v stops=%v", d, est.stopAfter)
	}
}

func TestEligibleAndLimit(t *testing.T) {
	small := Path{Backends: []string{"p1", "d1"}, MaxReqInputLen: 1000, ContextLen: 4096, PoolTokens: 4096}
	large := Path{Backends: []string{"p2", "d2"}, MaxReqInputLen: 3000, ContextLen: 4096, PoolTokens: 4096}
	paths := []Path{small, large}
	if got := Limit(paths, 0, 0); got != 2999 {
		t.Fatalf("Limit = %d", got)
	}
	if got := Eligible(paths, 1500, 0, 0); len(got) != 1 || paths[got[0]].Backends[0] != "p2" {
		t.Fatalf("only the large pair admits 1500: %+v", got)
	}
	if got := Eligible(paths, 3000, 0, 0); len(got) != 0 {
		t.Fatalf("nothing admits 3000: %+v", got)
	}
	if got := Limit(nil, 0, 0); got >= 0 {
		t.Fatalf("no paths must give a negative limit, got %d", got)
	}
}

func TestDecideOverheadAndDistrust(t *testing.T) {
	ctx := context.Background()
	text := strings.Repeat("word ", 10) // 50 bytes, 10 words
	// The byte bound admits only with the engine's special tokens added.
	if d := Decide(ctx, Request{Text: text, Bytes: 50, Overhead: 2}, 52, &wordEstimator{}, 1.3, nil); !d.Admit || d.Tier != TierBound || d.Tokens != 52 {
		t.Fatalf("bound + overhead = limit admits: %+v", d)
	}
	if d := Decide(ctx, Request{Text: text, Bytes: 50, Overhead: 2}, 51, &wordEstimator{}, 1.3, nil); d.Tier == TierBound {
		t.Fatalf("bound + overhead over the limit must not admit by bound: %+v", d)
	}
	// A distrusted estimate never admits: the gray zone asks the engine, or falls back to the bound.
	ex := &fixedExact{n: 30}
	if d := Decide(ctx, Request{Text: text, Bytes: 50, DistrustEstimate: true}, 40, &wordEstimator{}, 1.3, ex); !d.Admit || d.Tier != TierExact || ex.calls != 1 {
		t.Fatalf("distrusted estimate in the admit zone must ask for the exact count: %+v", d)
	}
	if d := Decide(ctx, Request{Text: text, Bytes: 50, DistrustEstimate: true}, 40, &wordEstimator{}, 1.3, &fixedExact{err: errors.New("down")}); d.Admit || !d.Undecided {
		t.Fatalf("without an exact count a distrusted estimate decides nothing (the byte bound 50 > 40): %+v", d)
	}
	if d := Decide(ctx, Request{Text: text, Bytes: 50, DistrustEstimate: true}, 100, &wordEstimator{}, 1.3, nil); !d.Admit || d.Tier != TierBound {
		t.Fatalf("the byte bound still admits: %+v", d)
	}
}

// Admission holds against the pool whatever else the engine says: issue 15's engine reported
// max_req_input_len 100,000 (and context 100,000) over a 4,006-token pool; 99,999 was
// advertised and a 30,000-token prompt admitted.
func TestPoolBindsOverInconsistentLimits(t *testing.T) {
	p := Path{MaxReqInputLen: 100000, ContextLen: 100000, PoolTokens: 4006}
	if got := Limit([]Path{p}, 0, 0); got > 4006 {
		t.Fatalf("advertised %d over a 4,006-token pool", got)
	}
	// With pages of one token the scheduler still reserves one: P + 1 < pool.
	if Admits(p, 30000, 0, 0) || Admits(p, 4005, 0, 0) || !Admits(p, 4004, 0, 0) {
		t.Fatal("P + page < pool must bind")
	}
	d := Decide(context.Background(), Request{InputIDs: 30000, HasInputIDs: true}, MaxPrompt(p, 0, 0), &wordEstimator{}, 1.3, nil)
	if d.Admit {
		t.Fatalf("30,000 tokens admitted: %+v", d)
	}
	// A PD pair: the smaller pool binds even when the other side's limits are larger.
	if got := MaxPrompt(Path{MaxReqInputLen: 8186, ContextLen: 16384, PoolTokens: 2048, PageSize: 16}, 0, 0); got != 2048-16-1 {
		t.Fatalf("MaxPrompt = %d, want the pool 2048 less a page of 16, less 1", got)
	}
}

// The pool edge by the page (issue 39, sglang#39271): SGLang validated inputs of 190,720–190,777
// tokens against a 190,784-token pool (pages of 64) and then never scheduled them; the rule
// admits up to 190,719 and refuses from 190,720, below max_req_input_len (190,778). Pages of one
// token leave max_req_input_len binding, as before.
func TestPageReservationBindsBelowMaxReqInputLen(t *testing.T) {
	p := Path{MaxReqInputLen: 190778, ContextLen: 262144, PoolTokens: 190784, PageSize: 64}
	if got := MaxPrompt(p, 0, 0); got != 190719 {
		t.Fatalf("MaxPrompt = %d, want 190,719", got)
	}
	for prompt := 190700; prompt <= 190790; prompt++ {
		if want := prompt <= 190719; Admits(p, prompt, 0, 0) != want {
			t.Errorf("prompt %d: admitted %v, want %v", prompt, !want, want)
		}
	}
	p.PageSize = 1
	if got := MaxPrompt(p, 0, 0); got != 190777 {
		t.Fatalf("pages of one token: MaxPrompt = %d, want max_req_input_len − 1 = 190,777", got)
	}
	p.PageSize = 0 // unknown counts as the smallest page, never as none
	if got := MaxPrompt(p, 0, 0); got != 190777 {
		t.Fatalf("page 0: MaxPrompt = %d", got)
	}
}

// A decode server preallocates a transferred request only while P + num_reserved_decode_tokens
// fits its pool (SGLang's DecodePreallocQueue): a pair whose decode pool is the smaller one admits
// up to decode pool − reserve, below both its max_req_input_len and the page edge.
func TestDecodePreallocationBinds(t *testing.T) {
	p := Path{MaxReqInputLen: 2042, ContextLen: 8192, PoolTokens: 2048, PageSize: 16, DecodePool: 2048, DecodeReserve: 512}
	if got := MaxPrompt(p, 0, 0); got != 1536 {
		t.Fatalf("MaxPrompt = %d, want 2048 − 512", got)
	}
	if !Admits(p, 1536, 0, 0) || Admits(p, 1537, 0, 0) {
		t.Fatal("the decode's preallocation edge is P + reserve ≤ pool")
	}
	p.DecodePool = 0 // no decode server on the path (unified)
	if got := MaxPrompt(p, 0, 0); got != 2031 {
		t.Fatalf("without a decode server: MaxPrompt = %d, want the page edge 2031", got)
	}
}
