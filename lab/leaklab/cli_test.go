package leaklab_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
)

// The full default run, through the real binary, twice: valid JSON of the
// issue's schema, byte-identical for the same seed.
func TestLeaklabCLIAllIsDeterministic(t *testing.T) {
	bin := procs.LabBinary(t)
	run := func() []byte {
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, "leaklab", "--experiment", "all", "--seed", "1", "--json")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kvgate leaklab: %v\n%s", err, errb.String())
		}
		return out.Bytes()
	}
	a, b := run(), run()
	if !bytes.Equal(a, b) {
		t.Fatal("same seed printed different JSON")
	}
	var doc struct {
		Experiments []struct {
			Experiment string            `json:"experiment"`
			Params     map[string]any    `json:"params"`
			Rows       []json.RawMessage `json:"rows"`
			Summary    *struct {
				Status200    int `json:"status_200"`
				ForeignShare struct {
					Min, Median, Max *float64
				} `json:"foreign_share"`
				Tenants struct {
					Min, Median, Max *float64
				} `json:"tenants"`
			} `json:"summary"`
			Trials []json.RawMessage `json:"trials"`
		} `json:"experiments"`
	}
	if err := json.Unmarshal(a, &doc); err != nil {
		t.Fatalf("invalid JSON: %v", err)
	}
	want := []struct {
		name string
		rows int
	}{{"warmup", 7}, {"warm", 0}, {"allocators", 3}, {"fixes", 5}}
	if len(doc.Experiments) != len(want) {
		t.Fatalf("%d experiments", len(doc.Experiments))
	}
	for i, w := range want {
		e := doc.Experiments[i]
		if e.Experiment != w.name || len(e.Rows) != w.rows || e.Params["seed"] != 1.0 {
			t.Errorf("experiment %d: %s with %d rows, params %v", i, e.Experiment, len(e.Rows), e.Params)
		}
	}
	warm := doc.Experiments[1]
	if warm.Summary == nil || len(warm.Trials) != 100 || warm.Summary.Status200 != 100 || warm.Summary.ForeignShare.Median == nil {
		t.Errorf("warm experiment: %+v with %d trials", warm.Summary, len(warm.Trials))
	}
}
