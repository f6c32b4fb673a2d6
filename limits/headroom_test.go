package limits

import (
	"testing"
	"time"
)

func TestHeadroomAfter(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  Rates
		v    Verdict
		want Headroom
	}{
		{"first request at 60 rpm", Rates{RPM: 60}, Verdict{Allowed: true, RPMFill: 1000},
			Headroom{RPM: 60, RemainingRequests: 59, ResetRequests: time.Second}},
		{"full cell", Rates{RPM: 10}, Verdict{RPMFill: 60000},
			Headroom{RPM: 10, RemainingRequests: 0, ResetRequests: time.Minute}},
		{"tokens, fraction of a token rounds down", Rates{TPM: 1000}, Verdict{TPMFill: 150.5},
			Headroom{TPM: 1000, RemainingTokens: 997, ResetTokens: 151 * time.Millisecond}},
		{"both, empty cells", Rates{RPM: 5, TPM: 100, MaxConcurrent: 2}, Verdict{Allowed: true},
			Headroom{RPM: 5, TPM: 100, RemainingRequests: 5, RemainingTokens: 100}},
		{"concurrency only: nothing to report", Rates{MaxConcurrent: 3}, Verdict{Allowed: true, RPMFill: 5},
			Headroom{}},
		{"a negative share (cannot split) reports no limit", Rates{RPM: -1}, Verdict{},
			Headroom{}},
	} {
		if got := HeadroomAfter(c.lim, c.v); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
	// OpenAI's reset format is Go's duration format: "6m0s", "1s", "20ms".
	if s := (6 * time.Minute).String(); s != "6m0s" {
		t.Fatalf("duration format %q", s)
	}
}
