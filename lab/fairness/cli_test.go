package fairness_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os/exec"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/redistest"
)

// The short run through the real binaries (kvgate-lab and the kvgate replicas it starts, on the
// test Redis): the JSON has every field the issue names, for every set-up and replica count,
// and the figures are sane (fractions in range, shares summing to 1, none's leftover share 1 by
// definition, a TTFT for every answered light tenant). It checks shape, not timing.
func TestFairnessCLIShortShape(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 9 gateway processes")
	}
	_, prefix := redistest.Open(t)
	var out, errb bytes.Buffer
	cmd := exec.Command(procs.LabBinary(t), "fairness", "--short", "--json",
		"--kvgate", procs.Binary(t), "--redis-url", redistest.URL(), "--prefix", prefix)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvgate-lab fairness: %v\n%s", err, errb.String())
	}
	var doc struct {
		Params struct {
			Replicas []int    `json:"replicas"`
			Setups   []string `json:"setups"`
		} `json:"params"`
		Rows []struct {
			Setup        *string  `json:"setup"`
			Replicas     *int     `json:"replicas"`
			PoolFullHits *int     `json:"pool_full_hits"`
			KVUse        *float64 `json:"kv_use"`
			Lights       []struct {
				Tenant               string
				Requests, Unanswered *int
				TTFTP50              *float64 `json:"ttft_p50_ms"`
				TTFTP99              *float64 `json:"ttft_p99_ms"`
				SoloP50              *float64 `json:"solo_ttft_p50_ms"`
				SoloP99              *float64 `json:"solo_ttft_p99_ms"`
				Refused              *int
			} `json:"lights"`
			Heavy struct {
				LeftoverShare *float64 `json:"leftover_share"`
				TokensPerS    *float64 `json:"tokens_per_s"`
			} `json:"heavy"`
			WeightShare map[string]float64 `json:"weight_share"`
			Jain        *float64           `json:"jain"`
		} `json:"rows"`
		Note string `json:"note"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, out.String())
	}
	if len(doc.Params.Replicas) != 2 || len(doc.Params.Setups) != 3 || len(doc.Rows) != 6 || doc.Note == "" {
		t.Fatalf("short run: replicas %v, setups %v, %d rows, note %q; want 2 × 3 rows", doc.Params.Replicas, doc.Params.Setups, len(doc.Rows), doc.Note)
	}
	seen := map[[2]any]bool{}
	for _, r := range doc.Rows {
		if r.Setup == nil || r.Replicas == nil || r.PoolFullHits == nil || r.KVUse == nil || r.Heavy.LeftoverShare == nil ||
			r.Heavy.TokensPerS == nil || r.Jain == nil {
			t.Fatalf("a row lacks a field: %+v", r)
		}
		key := [2]any{*r.Setup, *r.Replicas}
		if seen[key] {
			t.Errorf("row %v twice", key)
		}
		seen[key] = true
		if *r.PoolFullHits < 0 || *r.KVUse <= 0 || *r.KVUse > 1 || *r.Jain < 0.5-1e-9 || *r.Jain > 1+1e-9 || *r.Heavy.TokensPerS <= 0 {
			t.Errorf("%v: pool_full_hits %d, kv_use %v, jain %v, heavy tokens/s %v out of range", key, *r.PoolFullHits, *r.KVUse, *r.Jain, *r.Heavy.TokensPerS)
		}
		if s := r.WeightShare["4"] + r.WeightShare["1"]; math.Abs(s-1) > 0.002 {
			t.Errorf("%v: weight shares %v sum to %v", key, r.WeightShare, s)
		}
		if *r.Setup == "none" && math.Abs(*r.Heavy.LeftoverShare-1) > 0.002 {
			t.Errorf("%v: none's leftover share %v, 1 by definition", key, *r.Heavy.LeftoverShare)
		}
		if len(r.Lights) != 2 {
			t.Fatalf("%v: %d light tenants, want 2", key, len(r.Lights))
		}
		for _, l := range r.Lights {
			if l.Requests == nil || l.Unanswered == nil || l.TTFTP50 == nil || l.TTFTP99 == nil || l.SoloP50 == nil || l.SoloP99 == nil || l.Refused == nil {
				t.Fatalf("%v: light tenant %q lacks a field", key, l.Tenant)
			}
			if *l.SoloP50 <= 0 || *l.SoloP99 < *l.SoloP50 || *l.TTFTP99 < *l.TTFTP50 {
				t.Errorf("%v %s: solo p50/p99 %v/%v, ttft p50/p99 %v/%v", key, l.Tenant, *l.SoloP50, *l.SoloP99, *l.TTFTP50, *l.TTFTP99)
			}
			if *l.Requests+*l.Unanswered+*l.Refused == 0 {
				t.Errorf("%v %s: no request at all", key, l.Tenant)
			}
			if *l.Requests > 0 && *l.TTFTP50 <= 0 {
				t.Errorf("%v %s: %d answered but no TTFT", key, l.Tenant, *l.Requests)
			}
		}
	}
}
