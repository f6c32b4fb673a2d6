package leakwatch

import (
	"context"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/state"
)

// Incidents: a leak or an echo a reply's scan found is recorded (in the background: the store
// queues while Redis is away) and, for a leak, the path's backends quarantined as its evidence
// says.

// Leak records a leak the reply's scan found (a foreign marker, or another tenant's prompt text):
// the incident, and the quarantine of every backend on the path as its evidence says.
func (x *Watch) Leak(h canary.Hit) { x.record(state.KindLeak, h) }

// Echo records an echo: a marker the requester's own prompt carried came back (stripped).
func (x *Watch) Echo(h canary.Hit) { x.record(state.KindEcho, h) }

// record stores an incident in the background (the store queues while Redis is away) and, for
// a leak, quarantines every backend on the path, locally at once and for all replicas.
func (x *Watch) record(kind string, h canary.Hit) {
	g := x.w
	names := x.backends
	inc := state.Incident{Time: time.Now().UTC(), Kind: kind, Detector: state.DetectorMarker, RequestID: x.rid, Victim: h.Victim,
		Requester: x.tenant, Backends: names, Epoch: h.Epoch}
	if g.cfg.IncidentContext {
		inc.Context = h.Context // opt-in: text around the hit, markers redacted
	}
	printed := kind == state.KindLeak && x.printsEvidence(&inc, h)
	g.incidents.WithLabelValues(kind).Inc()
	// A short fragment in the reply to a token-id prompt whose text could not be read may be the
	// client's own: the reply is cut and the incident kept, but nothing is quarantined on it.
	// Prompt text alone quarantines nothing either (textQuarantine decides, in the background).
	quarantine := kind == state.KindLeak && !printed && !(x.idsUnread && shortFragment(h.Marker))
	if kind == state.KindLeak && !printed {
		inc.Evidence, inc.Quarantined = state.EvidenceMarker, quarantine
	}
	if printed {
		msg := "another tenant's prompt text in an engine reply: reply cut"
		if inc.Flagged {
			msg = "another tenant's prompt text in an engine reply: flagged (canary.fingerprints.mode monitor), reply passed on"
		}
		g.log.Error(msg,
			zap.String("request_id", x.rid), zap.String("engine_rid", x.engineRID), zap.String("requester", x.tenant), zap.String("victim", h.Victim),
			zap.Int("matches", inc.Matches), zap.Int("victims", inc.Victims), zap.Strings("backends", names))
	} else if kind == state.KindLeak && !quarantine {
		g.log.Error("foreign canary marker fragment in the reply to an unreadable token-id prompt: reply cut, no quarantine",
			zap.String("request_id", x.rid), zap.String("requester", x.tenant), zap.String("victim", h.Victim), zap.Strings("backends", names))
	} else if kind == state.KindLeak {
		g.log.Error("foreign canary marker in an engine reply: reply cut, backends quarantined",
			zap.String("request_id", x.rid), zap.String("engine_rid", x.engineRID), zap.String("requester", x.tenant), zap.String("victim", h.Victim),
			zap.Strings("backends", names), zap.Uint64("epoch", h.Epoch))
		for _, n := range names {
			g.quarantine.Mark(n, g.cfg.QuarantineTTL, "canary leak "+x.rid)
		}
	} else {
		g.log.Warn("echoed canary marker stripped (the requester's own prompt contained it)",
			zap.String("request_id", x.rid), zap.String("requester", x.tenant), zap.String("victim", h.Victim))
	}
	g.bg("incident_record", func(ctx context.Context) {
		if printed && !inc.Flagged {
			if g.textQuarantine(ctx, &inc) {
				quarantine = true
			}
		}
		if err := g.state.Incidents.Record(ctx, inc); err != nil {
			g.log.Error("incident not recorded", zap.String("request_id", x.rid), zap.Error(err))
		}
		if quarantine {
			for _, n := range names {
				if err := g.quarantine.Share(ctx, n); err != nil {
					g.log.Warn("quarantine not shared yet (kept locally, retried)", zap.String("backend", n), zap.Error(err))
				}
			}
		}
	})
}

// textQuarantine decides whether a prompt-text match quarantines its backends: only when text
// matches on one of them, within canary.fingerprints.corroboration_window, came from at least
// corroboration_tenants requesters against at least as many victims (shared by replicas
// through the state store; this replica's own record while it is away), and the requester has
// not triggered quarantines_per_requester quarantines in the window already. One tenant can make
// a reply look like another's text (the ROT13 of a paragraph, asked to be decoded; boilerplate
// two tenants pasted): that alone must not take an engine away from everyone. It marks the
// backends and fills inc (evidence, quarantined); true when it quarantined.
func (g *Watcher) textQuarantine(ctx context.Context, inc *state.Incident) bool {
	f := g.cfg.Fingerprints
	at := inc.Time
	// A shared store that does not answer within a second leaves the decision to this replica's
	// own record, which notes every match too (so it has the history when Redis goes away).
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	shared := g.state.Evidence != g.localEvidence
	corroborated := false
	for _, n := range inc.Backends {
		rq, vc, _ := g.localEvidence.Note(ctx, n, inc.Requester, inc.Victim, at, f.CorroborationWindow)
		if shared {
			if r, v, err := g.state.Evidence.Note(sctx, n, inc.Requester, inc.Victim, at, f.CorroborationWindow); err == nil {
				rq, vc = r, v
			} else {
				g.log.Warn("text evidence not shared (this replica's own record decides)", zap.String("backend", n), zap.Error(err))
			}
		}
		corroborated = corroborated || rq >= f.CorroborationTenants && vc >= f.CorroborationTenants
	}
	if !corroborated {
		g.log.Warn("prompt-text match alone: no quarantine (needs matches from more requesters against more victims on the engine)",
			zap.String("request_id", inc.RequestID), zap.String("requester", inc.Requester), zap.Strings("backends", inc.Backends))
		return false
	}
	inc.Evidence = state.EvidenceTextCorroborated
	ok, err := g.state.Evidence.Allow(sctx, inc.Requester, f.QuarantinesPerRequester, f.CorroborationWindow, at)
	if err != nil {
		ok, _ = g.localEvidence.Allow(ctx, inc.Requester, f.QuarantinesPerRequester, f.CorroborationWindow, at)
	}
	if !ok {
		g.textRefused.Inc()
		g.log.Warn("corroborated prompt-text match: quarantine refused (the requester triggered its share in the window)",
			zap.String("request_id", inc.RequestID), zap.String("requester", inc.Requester), zap.Strings("backends", inc.Backends))
		return false
	}
	g.log.Error("corroborated prompt-text leak: backends quarantined", zap.String("request_id", inc.RequestID),
		zap.String("requester", inc.Requester), zap.String("victim", inc.Victim), zap.Strings("backends", inc.Backends))
	for _, n := range inc.Backends {
		g.quarantine.Mark(n, g.cfg.QuarantineTTL, "corroborated prompt text leak "+inc.RequestID)
	}
	inc.Quarantined = true
	return true
}

// shortFragment says a hit carries fewer than canary.LooseMin marker characters: only the prefix
// scanner reports those ("KVG-" and 8 to 11 characters). A whole marker always gives at least
// LooseMin (the folded detector cuts there, before the rest arrives), and no reply lets more than
// 7 characters of a foreign marker reach a client, so a tenant cannot learn enough to fake one.
func shortFragment(marker string) bool {
	n := 0
	for i := 0; i < len(marker); i++ {
		if c := marker[i] | 0x20; c >= 'a' && c <= 'z' || marker[i] >= '2' && marker[i] <= '7' {
			n++
		}
	}
	if len(marker) >= len(canary.MarkerPrefix) && strings.EqualFold(marker[:len(canary.MarkerPrefix)], canary.MarkerPrefix) {
		n -= 3 // "KVG"
	}
	return n < canary.LooseMin
}
