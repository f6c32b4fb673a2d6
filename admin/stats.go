package admin

// GET /admin/stats: the counters an operator looks at during an incident (refusals by reason,
// 429s and tokens by tenant, replies by status, canary incidents by kind), read from this
// replica's own metrics registry, so the status page needs no Prometheus. Counts are this
// replica's, since it started.

import (
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/apierr/respond"
)

// countRow is one labelled counter value.
type countRow struct {
	Labels map[string]string `json:"labels"`
	Value  float64           `json:"value"`
}

// statsFamilies are the series /admin/stats reports, by the name it reports them under.
var statsFamilies = map[string]string{
	"refusals":         "kvgate_admission_decisions_total",
	"rate_limited":     "kvgate_ratelimited_total",
	"tokens_settled":   "kvgate_tokens_settled_total",
	"requests":         "kvgate_requests_total",
	"canary_incidents": "kvgate_canary_incidents_total",
	"upstream_replies": "kvgate_upstream_responses_total",
	"over_budget":      "kvgate_replies_over_budget_total",
}

func (g *API) stats(ctx *fasthttp.RequestCtx) {
	if g.Metrics == nil {
		respond.Error(ctx, apierr.StateUnavailable("This replica has no metrics registry to read."), apierr.OpenAI)
		return
	}
	mfs, err := g.Metrics.Gather()
	if err != nil && len(mfs) == 0 {
		respond.Error(ctx, apierr.StateUnavailable("Reading the metrics failed: "+err.Error()), apierr.OpenAI)
		return
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	out := map[string][]countRow{}
	for key, name := range statsFamilies {
		rows := []countRow{}
		if mf := byName[name]; mf != nil {
			for _, m := range mf.GetMetric() {
				if name == "kvgate_admission_decisions_total" && labelValue(m, "decision") == "admit" {
					continue // refusals only
				}
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				rows = append(rows, countRow{Labels: labels, Value: m.GetCounter().GetValue()})
			}
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Value > rows[j].Value })
		out[key] = rows
	}
	writeJSON(ctx, 200, map[string]any{"scope": "this replica, since it started", "counters": out})
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}
