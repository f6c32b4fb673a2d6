package enginesim

import (
	"fmt"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// The scheduler's side of admission (issue 39): what SGLang does with a prompt that passed the
// input check. With DP attention each rank runs its own scheduler over its own pool, and the
// server's controller hands requests out round robin; each rank checks the input against its own
// max_req_input_len. A rank's PrefillAdder then admits a request only while
// prompt + clamped output + page_size < the rank's free pool (the output clamped to
// pool − ceil_page(prompt) − page_size − 1, never below 0), so on an empty rank a prompt with
// prompt + page_size ≥ pool is never scheduled: SGLang keeps it waiting forever (sglang#39271).
// A decode server's edge is its preallocation's instead (prompt + num_reserved_decode_tokens).
// The simulator answers it at once (503, reason "unschedulable" in /sim/stats) so that a test
// sees it. The ranks share the simulator's one page allocator (sized to rank 0's pool); their
// pool sizes decide what each can schedule and what /server_info and /v1/loads report.

// dpRank is one DP attention rank: its pool in tokens (a page multiple) and its input limit.
type dpRank struct{ pool, mril int }

// newRanks derives each rank's pool and max_req_input_len from the configuration.
func newRanks(cfg Config) []dpRank {
	ranks := make([]dpRank, cfg.DPSize)
	for r := range ranks {
		pool := (cfg.PoolTokens/cfg.PageSize - r*cfg.DPPoolSkew) * cfg.PageSize
		ranks[r] = dpRank{pool: pool, mril: kvmodel.MaxReqInputLen(pool, cfg.PageSize, cfg.ContextLength)}
	}
	return ranks
}

// pickRank is the DP controller's round robin.
func (s *Server) pickRank() dpRank {
	return s.ranks[int((s.nextRank.Add(1)-1)%uint64(len(s.ranks)))]
}

// unschedulable says why rank r's scheduler could never run a prompt of p tokens ("" when it can).
// A decode server runs no PrefillAdder for a transferred request: its DecodePreallocQueue takes
// one only while prompt + num_reserved_decode_tokens fits the free pool.
func (s *Server) unschedulable(r dpRank, p int) string {
	if s.cfg.Mode == ModeDecode {
		if p+s.cfg.ReservedDecodeTokens <= r.pool {
			return ""
		}
		return fmt.Sprintf("The request (%d tokens) can never be preallocated: prompt + num_reserved_decode_tokens (%d) exceeds the KV pool "+
			"of its DP rank (%d tokens). SGLang keeps it waiting forever; the simulator answers at once.", p, s.cfg.ReservedDecodeTokens, r.pool)
	}
	if p+s.cfg.PageSize < r.pool {
		return ""
	}
	return fmt.Sprintf("The request (%d tokens) can never be scheduled: prompt + page_size (%d) is not below the KV pool of its DP rank "+
		"(%d tokens). SGLang keeps it waiting forever; the simulator answers at once.", p, s.cfg.PageSize, r.pool)
}

// checkInput is the whole of SGLang's check of a prompt of p tokens on the rank the controller
// sends it to: the input limits (checkLengths, 400), then the scheduler's page reservation (503).
func (s *Server) checkInput(p, o int, oGiven bool) (reason, msg string, status int) {
	r := s.pickRank()
	if reason, msg = s.checkLengths(p, o, oGiven, r.mril); reason != "" {
		return reason, msg, 400
	}
	if msg = s.unschedulable(r, p); msg != "" {
		return "unschedulable", msg, 503
	}
	return "", "", 0
}
