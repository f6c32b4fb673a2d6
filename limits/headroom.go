package limits

import (
	"math"
	"time"
)

// Headroom is what a tenant may still spend at once after a decision, in the terms of OpenAI's
// x-ratelimit-* headers: for each rate limit that is set, the limit, what remains of its burst,
// and how long until its cell is empty again (the limit "resets to its initial state").
type Headroom struct {
	// RPM and TPM are the limits the decision was made against (the replica's local share while
	// the shared store is unreachable); 0: not limited, and no headers for it.
	RPM, TPM                   int
	RemainingRequests          int64
	RemainingTokens            int64
	ResetRequests, ResetTokens time.Duration
}

// HeadroomAfter reads v's cell fills (milliseconds of the one-minute window) against lim.
func HeadroomAfter(lim Rates, v Verdict) Headroom {
	h := Headroom{RPM: max(lim.RPM, 0), TPM: max(lim.TPM, 0)}
	left := func(fill float64, perMinute int) int64 {
		// 1e-9 absorbs float noise: 59000 ms of room at 60 rpm is 59 requests, not 58.
		n := math.Floor((window-math.Max(fill, 0))*float64(perMinute)/window + 1e-9)
		return int64(math.Max(n, 0))
	}
	reset := func(fill float64) time.Duration {
		return time.Duration(math.Ceil(math.Max(fill, 0))) * time.Millisecond
	}
	if h.RPM > 0 {
		h.RemainingRequests, h.ResetRequests = left(v.RPMFill, h.RPM), reset(v.RPMFill)
	}
	if h.TPM > 0 {
		h.RemainingTokens, h.ResetTokens = left(v.TPMFill, h.TPM), reset(v.TPMFill)
	}
	return h
}
