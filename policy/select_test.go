package policy

import (
	"math/rand"
	"testing"
)

func TestOrderLeastLoadThenRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	loads := []int64{50, 10, 10, 30, 10}
	firsts := map[int]int{}
	for i := 0; i < 3000; i++ {
		o := Order(loads, rng.Intn)
		if len(o) != 5 {
			t.Fatalf("order %v", o)
		}
		for k := 1; k < len(o); k++ {
			if loads[o[k]] < loads[o[k-1]] {
				t.Fatalf("not least load first: %v", o)
			}
		}
		if o[3] != 3 || o[4] != 0 {
			t.Fatalf("heavier paths must come last: %v", o)
		}
		firsts[o[0]]++
	}
	// The three tied paths each come first about a third of the time.
	for _, i := range []int{1, 2, 4} {
		if firsts[i] < 800 || firsts[i] > 1200 {
			t.Fatalf("tie-break not random: %v", firsts)
		}
	}
	if o := Order(nil, rng.Intn); len(o) != 0 {
		t.Fatalf("no paths: %v", o)
	}
}

func TestReasonNamesTheBindingLimit(t *testing.T) {
	paths := []Path{{MaxReqInputLen: 4090, ContextLen: 8192, PoolTokens: 4096}}
	if r := Reason(paths, 3000, 0, 2000); r != ReasonTenantMaxPrompt {
		t.Fatalf("under the engines' limit, over the tenant's: %s", r)
	}
	if r := Reason(paths, 5000, 0, 2000); r != ReasonContextLength {
		t.Fatalf("over the engines' limit: %s", r)
	}
	if r := Reason(paths, 5000, 0, 0); r != ReasonContextLength {
		t.Fatalf("no tenant cap: %s", r)
	}
}
