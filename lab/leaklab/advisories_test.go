package leaklab

import (
	"testing"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// The advisories against a real gateway (default settings, canaries on): whatever is detected,
// no leaking reply gives a client more of a victim's prompt text than the documented bound;
// a residue as long as the reply (the earlier request's whole output) is cut most of the time;
// clients cannot set the thinking budget that forced-reasoning-end needs (the gateway refuses
// the field), and with the engine's own default budget the string that leaks is the engine's,
// which holds no tenant's text.
func TestAdvisoriesAgainstTheGateway(t *testing.T) {
	p := DefaultAdvisoryParams()
	p.Requests, p.Residues = 60, []int{64}
	rep, err := p.RunAdvisories(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 3 {
		t.Fatalf("%d rows", len(rep.Rows))
	}
	for _, x := range rep.Rows {
		r := x.(AdvisoryRow)
		t.Logf("%+v", r)
		if r.MaxVictimRun > r.Bound {
			t.Errorf("%s %s: %d folded characters of a victim's prompt reached a client, over the bound %d", r.Bug, r.Variant, r.MaxVictimRun, r.Bound)
		}
	}
	residue, clientBudget, engineBudget := rep.Rows[0].(AdvisoryRow), rep.Rows[1].(AdvisoryRow), rep.Rows[2].(AdvisoryRow)
	// Which requests share a slot depends on the schedule, so the rates are bounded loosely: two
	// runs of 200 measured 0.71 and 0.79 detected (docs/lab.md); a slot is reused even by requests
	// run one after another, so most replies leak whatever the load.
	if residue.Bug != kvmodel.BugBatchSlotResidue || residue.Leaking < p.Requests/2 || residue.DetectRate == nil || *residue.DetectRate < 0.25 {
		t.Errorf("batch-slot-residue, the whole earlier reply: %+v", residue)
	}
	if clientBudget.Refused != p.Requests || clientBudget.Leaking != 0 {
		t.Errorf("thinking_token_budget from clients must be refused: %+v", clientBudget)
	}
	// This leak needs two streams to overlap, which a loaded machine may not give: what leaks is
	// checked whenever something did.
	if engineBudget.Leaking == 0 {
		t.Logf("forced-reasoning-end: no two streams overlapped in this run")
	} else if engineBudget.LeakedText != "</think>" {
		t.Errorf("forced-reasoning-end with the engine's budget: %+v", engineBudget)
	}
}
