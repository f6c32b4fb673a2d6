package leaklab

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// small is a reduced model that keeps the mechanism: the oversized request
// (6,400 tokens = 100 pages) exceeds the prefill pool (3,200 tokens) and
// fits a half-full decode pool of 400 pages.
func small(seed uint64, workers int) Params {
	p := DefaultParams()
	p.Seed, p.Workers = seed, workers
	p.PoolPages, p.PageSize, p.Tenants = 400, 64, 20
	p.PromptMedian, p.HoldMean = 500, 40
	p.OversizedTokens, p.PrefillPoolTokens, p.ContextLength = 6400, 3200, 8192
	p.WarmSteps = 200
	p.WarmupSteps = []int{0, 5, 50, 400}
	p.TrialsWarmup, p.TrialsWarm, p.TrialsAllocators, p.TrialsFixes = 8, 10, 6, 6
	return p
}

func runAll(t *testing.T, p Params) []byte {
	t.Helper()
	var reps []*Report
	for _, e := range Experiments {
		r, err := p.Run(e, nil)
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r)
	}
	b, err := json.Marshal(map[string]any{"experiments": reps})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSameSeedSameJSON(t *testing.T) {
	a := runAll(t, small(7, 1))
	b := runAll(t, small(7, 2)) // parallel trials must not change results
	if string(a) != string(b) {
		t.Fatalf("same seed, different JSON:\n%s\n%s", a, b)
	}
	c := runAll(t, small(8, 2))
	if string(a) == string(c) {
		t.Fatalf("different seeds gave identical JSON; the seed is not used")
	}
	// The schema: four experiments, no timing or host fields.
	var doc struct {
		Experiments []map[string]json.RawMessage `json:"experiments"`
	}
	if err := json.Unmarshal(a, &doc); err != nil || len(doc.Experiments) != 4 {
		t.Fatalf("bad document: %v", err)
	}
	for _, bad := range []string{"elapsed", "duration", "host", "time"} {
		if strings.Contains(string(a), `"`+bad) {
			t.Errorf("JSON holds a %q field", bad)
		}
	}
}

func TestWarmupMechanism(t *testing.T) {
	p := small(3, 2)
	r, err := p.Run("warmup", nil)
	if err != nil {
		t.Fatal(err)
	}
	rows := r.Rows
	first, last := rows[0].(WarmupRow), rows[len(rows)-1].(WarmupRow)
	// A fresh pool has nothing to leak; a long-warmed one leaks every time.
	if first.LeakRate != 0 || first.DetectRate != 0 {
		t.Errorf("cold pool leaked: %+v", first)
	}
	if last.LeakRate != 1 {
		t.Errorf("warm pool leak rate %v, want 1", last.LeakRate)
	}
	for _, x := range rows {
		row := x.(WarmupRow)
		if row.DetectRate > row.LeakRate {
			t.Errorf("detect rate above leak rate: %+v", row)
		}
	}
}

func TestFixesStopTheLeak(t *testing.T) {
	p := small(5, 2)
	r, err := p.Run("fixes", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"none": "200", "reject-at-admission": "400", "zero-on-release": "200", "ownership-tags": "500", "decode-length-check": "400"}
	for _, x := range r.Rows {
		row := x.(FixRow)
		if row.Statuses[want[row.Fix]] != row.Trials {
			t.Errorf("%s: statuses %v, want all %s", row.Fix, row.Statuses, want[row.Fix])
		}
		share := 0.0
		if row.ForeignShareMedian != nil {
			share = *row.ForeignShareMedian
		}
		if row.Fix == "none" && share <= 0 {
			t.Errorf("no fix, yet no foreign share")
		}
		if row.Fix != "none" && share != 0 {
			t.Errorf("%s: foreign share %v", row.Fix, share)
		}
	}
	// With the bug off the oversized request is refused outright.
	p.Bug = "none"
	r, err = p.Run("warm", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Summary.Status200 != 0 || *r.Summary.ForeignShare.Max != 0 {
		t.Errorf("bug off: %+v", r.Summary)
	}
}

func TestMedianOfNothingIsNull(t *testing.T) {
	if median(nil) != nil {
		t.Fatal("median of an empty set is not nil")
	}
	b, _ := json.Marshal(AllocatorRow{Allocator: "lifo"})
	if !strings.Contains(string(b), `"source_age_median":null`) {
		t.Errorf("empty median encodes as %s", b)
	}
	if m := median([]float64{3, 1, 2, 10}); m == nil || *m != 2.5 {
		t.Errorf("median = %v", m)
	}
}

func TestSVGPerExperiment(t *testing.T) {
	dir := t.TempDir()
	p := small(1, 2)
	for _, e := range Experiments {
		r, err := p.Run(e, nil)
		if err != nil {
			t.Fatal(err)
		}
		path, err := WriteSVG(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasPrefix(string(b), "<svg") || !strings.HasSuffix(string(b), "</svg>\n") {
			t.Errorf("%s: not an SVG document", filepath.Base(path))
		}
	}
}
