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
// and is then never scheduled (sglang#39271). Against real simulator processes that model the
// reservation and DP ranks with pools of their own (rank r has r pages fewer), a real gateway on
// loopback gets token-id prompts of every size from the smallest rank's pool − 2 pages to the
// largest's + 2 pages, one token apart, on /generate and /v1/completions: the gateway admits
// exactly the prompts every rank can schedule (a 200 from the engine), refuses every other with
// a 413 in the route's envelope, and no request reaches the engine that it cannot schedule. A
// prefill + decode pair (the prefill's pool the smaller) is swept the same way.
func TestPageEdgeSweep(t *testing.T) {
	for _, page := range []int{1, 16, 64} {
		for _, dp := range []int{1, 2} {
			t.Run(fmt.Sprintf("page%d_dp%d", page, dp), func(t *testing.T) { sweepPageEdge(t, page, dp, false) })
		}
	}
	t.Run("pd_page64_dp2", func(t *testing.T) { sweepPageEdge(t, 64, 2, true) })
}

func sweepPageEdge(t *testing.T, page, dp int, pd bool) {
	const pool, ctxLen = 2048, 8192
	start := func(mode string, pool int) *procs.Sim {
		args := []string{"--mode", mode, "--pool-tokens", strconv.Itoa(pool), "--context-length", strconv.Itoa(ctxLen),
			"--page-size", strconv.Itoa(page), "--dp-size", strconv.Itoa(dp), "--dp-pool-skew", "1", "--tokenizer", "chunk4"}
		if mode == "prefill" {
			args = append(args, "--bootstrap-port", "0")
		}
		return procs.StartSim(t, args...)
	}
	var sims []*procs.Sim // the engine that answers (unified, or decode) last
	var backends string
	if pd {
		pre, dec := start("prefill", pool), start("decode", 2*pool)
		sims = []*procs.Sim{pre, dec}
		backends = fmt.Sprintf(`[{name: p, url: %q, role: prefill}, {name: d, url: %q, role: decode}]`, pre.URL, dec.URL)
	} else {
		sim := start("combined", pool)
		sims = []*procs.Sim{sim}
		backends = fmt.Sprintf(`[{name: eng, url: %q, role: unified}]`, sim.URL)
	}
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, backendsYAML(backends, "")))
	// What the engine can run: on every rank, P < its max_req_input_len and P + page < its pool.
	limit, smallest := ctxLen, pool
	for r := 0; r < dp; r++ {
		rankPool := pool - r*page
		mril := min(ctxLen-1, rankPool-1) - 5
		limit = min(limit, mril-1, rankPool-page-1)
		smallest = min(smallest, rankPool)
	}
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
	for p := smallest - 2*page; p <= pool+2*page; p++ {
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
	t.Logf("page %d, %d DP ranks, PD pair %v: up to %d tokens admitted (%d requests), %d refused", page, dp, pd, limit, admitted, refused)
}
