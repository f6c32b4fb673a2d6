package leakwatch

import (
	"context"
	"strings"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tokenize"
)

// coverTokenIDs extends the echo set to token-id prompts, once the route is known. Token ids
// carry text like any prompt: a tenant who puts another tenant's marker (or 8 characters of it)
// into input_ids and gets it repeated back must get an echo, not a leak incident and a
// quarantine for everyone. The text is what the engine that will serve reads: its /detokenize
// (decode's for a PD pair, which writes the reply, else prefill's). An engine that cannot
// detokenize leaves the gateway's own vocabulary as a best effort, and marks the exchange so that
// a fragment in the reply cuts it without quarantining the route.
func (x *Watch) coverTokenIDs(route *backends.Route, enc tokenize.Encoder) {
	g := x.w
	if g.keyring == nil || route == nil || x.req == nil || !hasIDs(x.req.Prompts) {
		return // nothing to read back (most requests): no context, no timer
	}
	var engines []*backends.Backend
	for _, b := range []*backends.Backend{route.Unified, route.Decode, route.Prefill} {
		if b != nil {
			engines = append(engines, b)
		}
	}
	timeout := g.exactTimeout
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var all strings.Builder
	for _, p := range x.req.Prompts {
		if !p.HasIDs || len(p.Tokens) == 0 {
			continue
		}
		text, ok := "", false
		for _, b := range engines {
			t, err := b.Detokenize(ctx, p.Tokens, timeout)
			if err == nil {
				text, ok = t, true
				break
			}
			if ctx.Err() != nil {
				break
			}
		}
		if !ok {
			x.idsUnread = true
			if d, isDecoder := enc.(tokenize.Decoder); isDecoder {
				text, _ = d.Decode(p.Tokens) // best effort: the engine's vocabulary may differ
			}
			g.log.Debug("token-id prompt not detokenized by the engine: marker fragments in its reply will not quarantine",
				zap.String("request_id", x.rid), zap.Strings("backends", route.Backends))
		}
		all.WriteString(text)
		all.WriteByte('\n')
	}
	if all.Len() == 0 {
		return
	}
	x.fp.idsText = all.String()
	x.echoes = mergeEchoes(x.echoes, g.keyring.FindMarkerFragments(all.String()))
}

// mergeEchoes appends the markers of add not yet in set.
func mergeEchoes(set, add []string) []string {
	for _, m := range add {
		dup := false
		for _, o := range set {
			dup = dup || o == m
		}
		if !dup {
			set = append(set, m)
		}
	}
	return set
}

func hasIDs(ps []request.Prompt) bool {
	for _, p := range ps {
		if p.HasIDs && len(p.Tokens) > 0 {
			return true
		}
	}
	return false
}
