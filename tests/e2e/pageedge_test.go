package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// TestPageEdgeSweep (issue 39): SGLang's scheduler reserves a page per request, so a prompt P
// with P + page_size ≥ its DP rank's pool passes the engine's input check (P < max_req_input_len)
// and is then never scheduled (sglang#39271); a decode server preallocates a transferred request
// only while P + num_reserved_decode_tokens fits its pool. Against real simulator processes that
// model both and DP ranks with pools of their own (rank r has r pages fewer), a real gateway on
// loopback gets token-id prompts of every size from the smallest edge's pool − 2 pages to the
// pool + 2 pages, one token apart, on /generate and /v1/completions: the gateway admits exactly
// the prompts every engine's every rank can run (a 200 from the engine), refuses every other with
// a 413 in the route's envelope, and no request reaches an engine that cannot run it. Prefill +
// decode pairs are swept the same way, with the prefill's pool the smaller and with the decode's.
func TestPageEdgeSweep(t *testing.T) {
	const pool = 2048
	for _, page := range []int{1, 16, 64} {
		for _, dp := range []int{1, 2} {
			t.Run(fmt.Sprintf("page%d_dp%d", page, dp), func(t *testing.T) {
				sweepPageEdge(t, page, dp, []engine{{"combined", pool}})
			})
		}
	}
	t.Run("pd_page64_dp2_prefill_smaller", func(t *testing.T) {
		sweepPageEdge(t, 64, 2, []engine{{"prefill", pool}, {"decode", 2 * pool}})
	})
	t.Run("pd_page16_dp2_decode_smaller", func(t *testing.T) {
		sweepPageEdge(t, 16, 2, []engine{{"prefill", 2 * pool}, {"decode", pool}})
	})
}

// engine is one simulator of a sweep: its mode and its rank 0's pool.
type engine struct {
	mode string
	pool int
}

// edge is the largest prompt an engine of mode can ever run on a rank with pool (and its
// max_req_input_len for the context): a decode server's preallocation (P + 512 ≤ pool), any
// other's scheduler (P + page < pool).
func edge(mode string, pool, page, ctxLen int) int {
	run := pool - page - 1
	if mode == "decode" {
		run = pool - 512
	}
	return min(min(ctxLen-1, pool-1)-5-1, run)
}

func sweepPageEdge(t *testing.T, page, dp int, engines []engine) {
	const ctxLen = 8192
	var sims []*procs.Sim
	var backends []string
	limit, lo, hi := ctxLen, ctxLen, 0
	for i, e := range engines {
		args := []string{"--mode", e.mode, "--pool-tokens", strconv.Itoa(e.pool), "--context-length", strconv.Itoa(ctxLen),
			"--page-size", strconv.Itoa(page), "--dp-size", strconv.Itoa(dp), "--dp-pool-skew", "1", "--tokenizer", "chunk4"}
		if e.mode == "prefill" {
			args = append(args, "--bootstrap-port", "0")
		}
		sim := procs.StartSim(t, args...)
		sims = append(sims, sim)
		role := map[string]string{"combined": "unified", "prefill": "prefill", "decode": "decode"}[e.mode]
		backends = append(backends, fmt.Sprintf(`{name: e%d, url: %q, role: %s}`, i, sim.URL, role))
		// What the engine can run: on every rank, P < its max_req_input_len and under its edge.
		for r := 0; r < dp; r++ {
			limit = min(limit, edge(e.mode, e.pool-r*page, page, ctxLen))
		}
	}
	// The sweep: around the engine whose edge binds, from 2 pages under the lower of its edge and
	// its smallest rank's pool to 2 pages over its largest rank's pool.
	for _, e := range engines {
		smallest := e.pool - (dp-1)*page
		if edge(e.mode, smallest, page, ctxLen) != limit {
			continue
		}
		lo, hi = min(lo, limit-2*page, smallest-2*page), max(hi, e.pool+2*page)
	}
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, backendsYAML("["+strings.Join(backends, ", ")+"]", "")))
	ids := func(n int) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(1000 + i%300))
		}
		return "[" + b.String() + "]"
	}
	admitted, refused := 0, 0
	for p := lo; p <= hi; p++ {
		list := ids(p)
		// Two routes, one after the other: an admitted size reaches consecutive DP ranks.
		for _, rt := range []struct{ path, body string }{
			{"/generate", `{"input_ids":` + list + `,"sampling_params":{"max_new_tokens":1}}`},
			{"/v1/completions", `{"model":"sim","prompt":` + list + `,"max_tokens":1}`},
		} {
			status, _, body := post(t, gw.URL+rt.path, rt.body, nil)
			switch {
			case p <= limit && status == 200:
				admitted++
			case p > limit && status == 413:
				refused++
				var env struct {
					Error struct {
						Message, Type string
						Code          *string
					} `json:"error"`
				}
				if json.Unmarshal([]byte(body), &env) != nil || env.Error.Message == "" || env.Error.Type == "" || env.Error.Code == nil {
					t.Fatalf("%s, %d tokens: a 413 outside the route's envelope: %s", rt.path, p, body)
				}
			default:
				t.Fatalf("%s, %d tokens (the engines run up to %d): %d %.300s", rt.path, p, limit, status, body)
			}
		}
	}
	for _, sim := range sims {
		st := sim.Stats(t)
		if len(st.Rejected) != 0 {
			t.Errorf("an engine refused or could never schedule admitted requests: %v", st.Rejected)
		}
		if served := st.Requests["/generate"] + st.Requests["/v1/completions"]; served != admitted {
			t.Errorf("an engine served %d requests, the gateway admitted %d", served, admitted)
		}
	}
	if admitted == 0 && page > 1 || refused == 0 {
		t.Errorf("the sweep did not reach both sides of the edge: %d admitted, %d refused", admitted, refused)
	}
	t.Logf("page %d, %d DP ranks, %v: prompts %d to %d, up to %d admitted (%d requests), %d refused", page, dp, engines, lo, hi, limit, admitted, refused)
}
