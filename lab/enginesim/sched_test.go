package enginesim_test

import (
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
)

// DP attention ranks (issue 39): each rank reports its own pool in /server_info's
// internal_states and /v1/loads (the top level is rank 0's), and the controller's round robin
// sends consecutive requests to consecutive ranks, each scheduling in its own pool: a prompt that
// fits rank 0 but not rank 1 (one page smaller) runs on one and is never scheduled on the other.
func TestDPRanksScheduleInTheirOwnPools(t *testing.T) {
	sim := procs.StartSim(t, "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16", "--dp-size", "2",
		"--dp-pool-skew", "1", "--tokenizer", "chunk4")
	var info struct {
		Pool   int `json:"max_total_num_tokens"`
		MRIL   int `json:"max_req_input_len"`
		DP     int `json:"dp_size"`
		States []struct {
			Page int `json:"page_size"`
			Mem  struct {
				Cap int `json:"token_capacity"`
			} `json:"memory_usage"`
		} `json:"internal_states"`
	}
	getJSON(t, sim.URL+"/server_info", &info)
	if info.Pool != 1024 || info.MRIL != 1018 || info.DP != 2 || len(info.States) != 2 ||
		info.States[0].Mem.Cap != 1024 || info.States[1].Mem.Cap != 1008 || info.States[1].Page != 16 {
		t.Fatalf("server info: %+v", info)
	}
	var loads struct {
		Count int `json:"dp_rank_count"`
		Loads []struct {
			Total int `json:"max_total_num_tokens"`
		} `json:"loads"`
	}
	getJSON(t, sim.URL+"/v1/loads", &loads)
	if loads.Count != 2 || len(loads.Loads) != 2 || loads.Loads[0].Total != 1024 || loads.Loads[1].Total != 1008 {
		t.Fatalf("loads: %+v", loads)
	}
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 1000 + i%300
		}
		return out
	}
	gen := func(n int) int {
		return post(t, sim.URL, "/generate", map[string]any{"input_ids": ids(n), "sampling_params": map[string]any{"max_new_tokens": 1}}).status
	}
	// Rank 0 (pool 1024, max_req_input_len 1018) runs up to 1007 tokens, rank 1 (pool 1008,
	// max_req_input_len 1002) up to 991: from 992 to 1001 its input check passes and its
	// scheduler never runs the request.
	for _, c := range []struct{ n, rank0, rank1 int }{{991, 200, 200}, {992, 200, 503}, {1001, 200, 503}, {1007, 200, 400}, {1008, 503, 400}} {
		got := [2]int{gen(c.n), gen(c.n)} // the round robin: rank 0, then rank 1
		if got != [2]int{c.rank0, c.rank1} {
			t.Errorf("%d tokens on ranks 0 and 1: %v, want [%d %d]", c.n, got, c.rank0, c.rank1)
		}
	}
	if st := sim.Stats(t); st.Rejected["unschedulable"] != 3 || st.Rejected["pool"] != 2 {
		t.Errorf("rejections: %v", st.Rejected)
	}
}
