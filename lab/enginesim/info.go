package enginesim

import (
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

func (s *Server) reportedMode() string {
	if s.cfg.Mode == ModeCombined {
		return "null"
	}
	return s.cfg.Mode
}

func (s *Server) engineType() string {
	if s.cfg.Mode == ModeCombined {
		return "unified"
	}
	return s.cfg.Mode
}

// serverInfo answers /server_info in the shape of SGLang's (top-level
// max_total_num_tokens and max_req_input_len; context_length is the unset
// CLI flag, null).
func (s *Server) serverInfo(ctx *fasthttp.RequestCtx) {
	pool := s.ranks[0].pool // the top level is rank 0's, as SGLang reports it with DP attention
	states := make([]any, len(s.ranks))
	for r, rk := range s.ranks {
		states[r] = map[string]any{
			"model_path":          s.cfg.Model,
			"page_size":           s.cfg.PageSize,
			"disaggregation_mode": s.reportedMode(),
			"dp_rank":             r,
			"memory_usage":        map[string]any{"token_capacity": rk.pool},
		}
	}
	wire.WriteJSON(ctx, map[string]any{
		"model_path":                      s.cfg.Model,
		"tokenizer_path":                  s.cfg.Model,
		"served_model_name":               s.cfg.Model,
		"context_length":                  nil,
		"is_embedding":                    false,
		"max_total_tokens":                s.cfg.PoolTokens,
		"page_size":                       s.cfg.PageSize,
		"tp_size":                         1,
		"pp_size":                         1,
		"dp_size":                         len(s.ranks),
		"enable_dp_attention":             len(s.ranks) > 1,
		"api_key":                         nil,
		"allow_auto_truncate":             false,
		"disaggregation_mode":             s.reportedMode(),
		"disaggregation_transfer_backend": "sim",
		"disaggregation_bootstrap_port":   s.BootstrapPort(),
		"num_reserved_decode_tokens":      s.cfg.ReservedDecodeTokens,
		"enable_metrics":                  true,
		"status":                          "ready",
		"max_total_num_tokens":            pool,
		"max_req_input_len":               s.mril,
		"internal_states":                 states,
		"sim": map[string]any{
			"allocator": s.cfg.Allocator, "tokenizer": s.cfg.Tokenizer, "bug": s.cfg.Bug, "fix": s.cfg.Fix,
			"seed": s.cfg.Seed, "context_length": s.cfg.ContextLength,
		},
		"version": "0.5.sim",
	})
}

func (s *Server) models(ctx *fasthttp.RequestCtx) {
	wire.WriteJSON(ctx, map[string]any{"object": "list", "data": []any{map[string]any{
		"id": s.cfg.Model, "object": "model", "created": s.created, "owned_by": "sglang",
		"root": s.cfg.Model, "max_model_len": s.cfg.ContextLength,
	}}})
}

type loadSnap struct {
	used, total, running, waiting, freePages, totalPages, poolFull int
}

func (s *Server) snapshot() loadSnap {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.pool.Free()
	return loadSnap{
		used:       (s.pool.NumPages - free) * s.pool.PageSize,
		total:      s.pool.Tokens(),
		running:    s.running,
		waiting:    s.waiting,
		poolFull:   s.poolFull,
		freePages:  free,
		totalPages: s.pool.NumPages,
	}
}

// loads answers /v1/loads as {"dp_rank_count":N,"loads":[{"dp_rank":r,
// "num_running_reqs","num_waiting_reqs","num_used_tokens",
// "max_total_num_tokens","token_usage"}, …]}. The ranks share one allocator here: its use is
// reported on rank 0.
func (s *Server) loads(ctx *fasthttp.RequestCtx) {
	l := s.snapshot()
	loads := make([]any, len(s.ranks))
	for r, rk := range s.ranks {
		used, running, waiting := 0, 0, 0
		if r == 0 {
			used, running, waiting = l.used, l.running, l.waiting
		}
		loads[r] = map[string]any{
			"dp_rank": r, "num_running_reqs": running, "num_waiting_reqs": waiting,
			"num_used_tokens": used, "max_total_num_tokens": rk.pool,
			"token_usage": float64(used) / float64(rk.pool),
		}
	}
	wire.WriteJSON(ctx, map[string]any{"dp_rank_count": len(s.ranks), "loads": loads})
}

func (s *Server) metrics(ctx *fasthttp.RequestCtx) {
	l := s.snapshot()
	labels := fmt.Sprintf(`{engine_type=%q,model_name=%q,pp_rank="0",tp_rank="0"}`, s.engineType(), s.cfg.Model)
	var b strings.Builder
	g := func(name, help string, v any) {
		fmt.Fprintf(&b, "# HELP sglang:%s %s\n# TYPE sglang:%s gauge\nsglang:%s%s %v\n", name, help, name, name, labels, v)
	}
	g("max_total_num_tokens", "Maximum total number of tokens in the KV pool.", l.total)
	g("num_used_tokens", "Number of used tokens.", l.used)
	g("token_usage", "Token usage of the KV pool (0-1).", float64(l.used)/float64(l.total))
	g("kv_available_tokens", "Free KV tokens.", l.total-l.used)
	g("kv_used_tokens", "Used KV tokens.", l.used)
	g("context_len", "Context length of the model.", s.cfg.ContextLength)
	g("page_size", "Tokens per KV page.", s.cfg.PageSize)
	g("num_running_reqs", "Number of running requests.", l.running)
	g("num_queue_reqs", "Number of queued requests.", l.waiting)
	switch s.cfg.Mode {
	case ModePrefill:
		g("num_prefill_bootstrap_queue_reqs", "Rooms waiting for decode.", s.rooms.Pending())
	case ModeDecode:
		g("num_decode_prealloc_queue_reqs", "Requests waiting for KV pages.", l.waiting)
	}
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.SetBodyString(b.String())
}

// SimStats is the body of GET /sim/stats.
type SimStats struct {
	Requests         map[string]int `json:"requests"`
	MaxPromptTokens  int            `json:"max_prompt_tokens"`
	TokenizeRequests int            `json:"tokenize_requests"`
	Rejected         map[string]int `json:"rejected"`
	// ForeignReplies counts replies that read stale pages of other requests (the leak), the
	// ground truth that reply headers only carry to a direct client.
	ForeignReplies int `json:"foreign_replies"`
	// RequestIDs are the X-Request-Id headers of the last 256 generation requests, oldest first.
	RequestIDs []string `json:"request_ids"`
	// RIDs are the "rid" fields of the same requests' bodies as JSON ("" when absent), in the
	// same order.
	RIDs []string `json:"rids"`
	// CacheSalts counts the distinct cache_salt values seen (and /generate's extra_key): the simulator
	// has no prefix cache to partition, so this is what a test can check.
	CacheSalts int `json:"cache_salts"`
	// PoolFullHits counts requests that found no room in the KV pool on arrival (they waited
	// for pages, or failed): the engine's overflow path.
	PoolFullHits int `json:"pool_full_hits"`
	Pool         struct {
		PagesTotal int `json:"pages_total"`
		PagesFree  int `json:"pages_free"`
	} `json:"pool"`
}

// Stats returns the counters of /sim/stats.
func (s *Server) Stats() SimStats {
	l := s.snapshot()
	var st SimStats
	s.statsMu.Lock()
	st.Requests = make(map[string]int, len(s.requests))
	for k, v := range s.requests {
		st.Requests[k] = v
	}
	st.Rejected = make(map[string]int, len(s.rejected))
	for k, v := range s.rejected {
		st.Rejected[k] = v
	}
	st.MaxPromptTokens, st.TokenizeRequests, st.ForeignReplies = s.maxPT, s.tokReqs, s.foreign
	st.RequestIDs = append([]string{}, s.headerIDs...)
	st.RIDs = append([]string{}, s.bodyRIDs...)
	st.CacheSalts = len(s.salts)
	s.statsMu.Unlock()
	st.Pool.PagesTotal, st.Pool.PagesFree = l.totalPages, l.freePages
	st.PoolFullHits = l.poolFull
	return st
}

func (s *Server) simStats(ctx *fasthttp.RequestCtx) { wire.WriteJSON(ctx, s.Stats()) }
