package audit

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Salt verdicts: whether a backend's prefix cache keeps one salt's prompts from another's.
const (
	SaltIsolated = "isolated" // a repeated prefix hits under its own salt and not under another
	SaltShared   = "shared"   // another salt found the prefix cached: the salt partitions nothing
	SaltUnknown  = "unknown"  // no cached-token figure, or no hit even under the same salt: cannot tell
)

// Header results of the X-Cache-Salt check (vllm#57609's header form of the salt).
const (
	HeaderIsolated = "isolated" // the header overrides the body and partitions the cache
	HeaderIgnored  = "ignored"  // the body's salt decided: the backend does not offer the header
	HeaderRefused  = "refused"  // 4xx: the backend says it cannot honour the header
	HeaderShared   = "shared"   // neither the header nor the body partitioned the cache
)

const (
	// HeaderCacheSalt is the header form of the salt.
	HeaderCacheSalt = "X-Cache-Salt"
	// HeaderPinBackend asks a kvgate gateway, with the admin key in HeaderAdminKey, to route a
	// request to one backend ("name") or one PD pair ("prefill,decode"); the gateway echoes it
	// in the reply when it did (a41-gateway.patch). A gateway that does not echo it routed as
	// it pleased, and the audit does not take the reply as that backend's.
	HeaderPinBackend = "X-Kvgate-Backend"
	HeaderAdminKey   = "X-Kvgate-Admin-Key"
)

const (
	// saltNonce random token ids begin every salt probe's prompt, so its prefix is in no cache
	// before the probe (and no other probe's prompt shares it).
	saltNonce = 16
	// saltPromptTokens is the size of a salt probe's prompt: several pages of any engine's
	// cache (SGLang's page size is 1 to 64 tokens), small against any limit.
	saltPromptTokens = 640
)

// SaltVerdict is one backend's (or PD pair's) salt isolation.
type SaltVerdict struct {
	Backend string `json:"backend"` // an engine's URL, "PREFILL + DECODE", or a gateway's backend name(s)
	Verdict string `json:"verdict"` // isolated | shared | unknown
	Via     string `json:"via"`     // direct | gateway
	// Salts says how the two salts differed: "body" (cache_salt, or /generate's extra_key, set by
	// the audit) or "tenants" (two tenants' keys through a gateway that salts per tenant).
	Salts string `json:"salts"`
	// The cached tokens reported for a new prompt, its repeat under the same salt, and under
	// another salt; absent when the reply carried no figure.
	FirstCached *int   `json:"first_cached,omitempty"`
	SameCached  *int   `json:"same_salt_cached,omitempty"`
	OtherCached *int   `json:"other_salt_cached,omitempty"`
	Header      string `json:"header,omitempty"` // the X-Cache-Salt check: isolated | ignored | refused | shared | unknown; "" not checked
	Detail      string `json:"detail"`
}

// saltUnit is what one verdict is about, and how to reach it.
type saltUnit struct {
	name  string
	via   string
	pin   string // HeaderPinBackend's value through a gateway; "" = not pinned
	salts string // body | tenants
}

// saltChecks adds one verdict per backend (or PD pair) the audit can reach.
func (a *auditor) saltChecks(ctx context.Context) {
	if a.o.NoSalts {
		return
	}
	units, why := a.saltUnits(ctx)
	if why != "" {
		a.addSalt(SaltVerdict{Backend: a.r.Target, Verdict: SaltUnknown, Via: "gateway", Detail: why})
		return
	}
	for _, u := range units {
		if ctx.Err() != nil {
			return
		}
		a.addSalt(a.saltCheck(ctx, u))
	}
}

// kvgate reports whether the target is a kvgate gateway (its /v1/models says owned_by kvgate).
func (a *auditor) kvgate() bool {
	return a.snd.target != nil && len(a.r.Servers) == 1 && a.r.Servers[0].OwnedBy == "kvgate"
}

// saltUnits lists what to check. Directly: the target, or the PD pair. Through kvgate, whose
// salt is the tenant's (it replaces the client's): two tenants' keys are needed, and one verdict
// per backend needs the backend list (admin key) and the gateway's pin; a gateway with one
// route needs no pin.
func (a *auditor) saltUnits(ctx context.Context) ([]saltUnit, string) {
	switch {
	case a.snd.target == nil:
		return []saltUnit{{name: a.eps[0].base + " + " + a.eps[1].base, via: "direct", salts: "body"}}, ""
	case !a.kvgate():
		return []saltUnit{{name: a.eps[0].base, via: "direct", salts: "body"}}, ""
	case a.o.SecondKey == "":
		return nil, "kvgate replaces the client's cache_salt with the tenant's: give a second tenant's key with --second-key to compare two tenants' salts"
	case a.o.AdminKey == "":
		a.r.Notes = append(a.r.Notes, "salt probes through the gateway are not pinned to a backend (no --admin-key): "+
			"the verdict holds for whichever backend served them")
		return []saltUnit{{name: "gateway", via: "gateway", salts: "tenants"}}, ""
	}
	combined, prefill, decode, err := a.gatewayBackends(ctx)
	if err != nil {
		return nil, "listing the gateway's backends: " + err.Error()
	}
	var units []saltUnit
	for _, b := range combined {
		units = append(units, saltUnit{name: b, via: "gateway", pin: b, salts: "tenants"})
	}
	for _, p := range prefill {
		for _, d := range decode {
			units = append(units, saltUnit{name: p + " + " + d, via: "gateway", pin: p + "," + d, salts: "tenants"})
		}
	}
	if len(units) == 1 {
		units[0].pin = "" // the only route: every request goes there
	}
	return units, ""
}

// gatewayBackends reads the gateway's /admin/backends: names by role, in name order.
func (a *auditor) gatewayBackends(ctx context.Context) (combined, prefill, decode []string, err error) {
	code, _, body, err := a.c.doAs(ctx, "GET", a.eps[0].base+"/admin/backends", nil, maxReplyBytes, reqOpts{key: a.o.AdminKey})
	if err != nil {
		return nil, nil, nil, err
	}
	if code != 200 {
		return nil, nil, nil, fmt.Errorf("GET /admin/backends answered %d: check --admin-key", code)
	}
	var list struct {
		Backends []struct {
			Name string `json:"name"`
			Role string `json:"configured_role"`
		} `json:"backends"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, nil, nil, fmt.Errorf("/admin/backends: %v", err)
	}
	for _, b := range list.Backends {
		switch b.Role {
		case "prefill":
			prefill = append(prefill, b.Name)
		case "decode":
			decode = append(decode, b.Name)
		default:
			combined = append(combined, b.Name)
		}
	}
	for _, l := range [][]string{combined, prefill, decode} {
		sort.Strings(l)
	}
	return combined, prefill, decode, nil
}

// saltProbe is one request of a salt check.
type saltProbe struct {
	ids    []int
	salt   string // body salt ("" = none)
	header string // X-Cache-Salt ("" = none)
	second bool   // sent with --second-key
}

// saltReply is what a salt probe got: the cached-token figure (nil if none), or why not.
type saltReply struct {
	cached  *int
	prefill *int // a PD pair's prefill leg's figure: its cache is the pair's too
	status  int
	fail    string // not 2xx, or no reply: the probe says nothing of the cache
}

func (a *auditor) sendSalt(ctx context.Context, u saltUnit, p saltProbe) saltReply {
	if !a.reserve(len(p.ids)) {
		return saltReply{fail: "over --budget"}
	}
	opts := reqOpts{hdr: map[string]string{}}
	if p.second {
		opts.key = a.o.SecondKey
	}
	if p.header != "" {
		opts.hdr[HeaderCacheSalt] = p.header
	}
	if u.pin != "" {
		opts.hdr[HeaderPinBackend], opts.hdr[HeaderAdminKey] = u.pin, a.o.AdminKey
	}
	body := a.body(prompt{ids: p.ids, tokens: len(p.ids), exact: true}, 1)
	if !a.o.Native {
		body["prompt"] = p.ids // OpenAI's completions take token ids too
	}
	if p.salt != "" {
		if a.o.Native {
			body["extra_key"] = p.salt // the native name; SGLang's OpenAI routes turn cache_salt into it
		} else {
			body["cache_salt"] = p.salt
		}
	}
	res := a.snd.sendAs(ctx, body, false, opts)
	switch {
	case res.err != nil:
		return saltReply{fail: gotText(res)}
	case res.status < 200 || res.status > 299:
		return saltReply{status: res.status, fail: fmt.Sprintf("HTTP %d: %s", res.status, clip(replyText(res.raw), 160))}
	case u.pin != "" && res.header.Get(HeaderPinBackend) != u.pin:
		return saltReply{status: res.status, fail: "the gateway did not confirm routing to " + u.pin + " (no " + HeaderPinBackend + " echo): the reply may be another backend's"}
	}
	return saltReply{cached: cachedTokens(res.raw), prefill: cachedTokens(res.prefillRaw), status: res.status}
}

// saltCheck runs one unit's probes: a new prompt, its repeat under the same salt, and under
// another salt; then, directly, the header form.
func (a *auditor) saltCheck(ctx context.Context, u saltUnit) SaltVerdict {
	a.o.Progress("salt/" + u.name + ": same and other salt on a repeated prefix")
	v := SaltVerdict{Backend: u.name, Via: u.via, Salts: u.salts}
	ids := a.saltPrompt()
	s1, s2 := newSalt(), newSalt()
	other := saltProbe{ids: variant(ids, 3), salt: s2}
	if u.salts == "tenants" {
		// The gateway sets the salt (and refuses a client's extra_key): the tenants differ.
		s1, other = "", saltProbe{ids: variant(ids, 3), second: true}
	}
	replies := []saltReply{}
	for _, p := range []saltProbe{{ids: variant(ids, 1), salt: s1}, {ids: variant(ids, 2), salt: s1}, other} {
		r := a.sendSalt(ctx, u, p)
		if r.fail != "" {
			v.Verdict, v.Detail = SaltUnknown, "a probe got no answer that says anything of the cache: "+r.fail
			return v
		}
		replies = append(replies, r)
	}
	v.FirstCached, v.SameCached, v.OtherCached = replies[0].cached, replies[1].cached, replies[2].cached
	v.Verdict, v.Detail = saltVerdict(v.FirstCached, v.SameCached, v.OtherCached)
	if a.snd.prefill != nil {
		// Both legs of a pair cache the prompt: the pair is isolated only if both are, and
		// shared if either is.
		pv, pd := saltVerdict(replies[0].prefill, replies[1].prefill, replies[2].prefill)
		v.Verdict, v.Detail = worseSalt(v.Verdict, "decode: "+v.Detail, pv, "prefill: "+pd)
	}
	if u.via == "direct" && v.Verdict != SaltUnknown {
		v.Header = a.headerCheck(ctx, u)
	}
	return v
}

// headerCheck asks whether X-Cache-Salt partitions the cache: after a prompt under (body s1,
// header h1), its repeat under (s2, h1) hits and under (s1, h2) misses where the header decides;
// the reverse where the body decides (the header is ignored: not offered).
func (a *auditor) headerCheck(ctx context.Context, u saltUnit) string {
	ids := a.saltPrompt()
	s1, s2, h1, h2 := newSalt(), newSalt(), newSalt(), newSalt()
	var got []*int
	for i, p := range []saltProbe{{ids: variant(ids, 1), salt: s1, header: h1},
		{ids: variant(ids, 2), salt: s2, header: h1}, {ids: variant(ids, 3), salt: s1, header: h2}} {
		r := a.sendSalt(ctx, u, p)
		if r.status >= 400 && r.status <= 499 && i == 0 {
			return HeaderRefused
		}
		if r.fail != "" || r.cached == nil {
			return SaltUnknown
		}
		got = append(got, r.cached)
	}
	return headerVerdict(*got[0], *got[1], *got[2])
}

// saltVerdict judges a new prompt's cached tokens (first), its repeat's under the same salt and
// under another. Only what the cache found beyond the new prompt's own figure counts (an engine
// may share a BOS token or a template's first tokens with everything). No figure, or no hit
// even under the same salt, is unknown: never isolated. It is pure.
func saltVerdict(first, same, other *int) (verdict, detail string) {
	switch {
	case first == nil || same == nil || other == nil:
		return SaltUnknown, "the backend reports no cached-token figure (usage.prompt_tokens_details.cached_tokens, " +
			"meta_info.cached_tokens): isolation cannot be told"
	case *same <= *first:
		return SaltUnknown, fmt.Sprintf("the repeated prefix under the same salt found %d cached tokens (a new prompt %d): "+
			"no prefix cache to test, or it was evicted at once", *same, *first)
	case *other > *first:
		return SaltShared, fmt.Sprintf("another salt found %d tokens of the prefix cached (the same salt %d, a new prompt %d): "+
			"the salt does not partition the prefix cache, so one tenant's prompt hits another's", *other, *same, *first)
	}
	return SaltIsolated, fmt.Sprintf("the same salt found %d tokens cached, another salt %d (a new prompt %d)", *same, *other, *first)
}

// worseSalt combines two legs' verdicts: shared if either is, isolated only if both are.
func worseSalt(v1, d1, v2, d2 string) (string, string) {
	rank := map[string]int{SaltIsolated: 0, SaltUnknown: 1, SaltShared: 2}
	if rank[v2] > rank[v1] {
		return v2, d2 + "; " + d1
	}
	return v1, d1 + "; " + d2
}

// headerVerdict judges the header check's three figures. It is pure.
func headerVerdict(first, headerSame, headerOther int) string {
	hit := func(n int) bool { return n > first }
	switch {
	case hit(headerSame) && !hit(headerOther):
		return HeaderIsolated
	case !hit(headerSame) && hit(headerOther):
		return HeaderIgnored
	case hit(headerSame) && hit(headerOther):
		return HeaderShared
	}
	return SaltUnknown
}

// addSalt records a verdict and its row in the findings: isolated passes, shared fails, unknown
// warns.
func (a *auditor) addSalt(v SaltVerdict) {
	f := Finding{Check: "salt/" + v.Backend, Kind: KindSalt, Sent: "-", Expected: SaltIsolated, Got: v.Verdict, Detail: v.Detail}
	switch {
	case v.Salts == "tenants":
		f.Sent = "via gateway, two tenants"
	case v.Salts == "body":
		f.Sent = "direct, two salts"
	case v.Via != "":
		f.Sent = "via " + v.Via
	}
	switch v.Verdict {
	case SaltIsolated:
		f.Verdict = Pass
	case SaltShared:
		f.Verdict = Fail
	default:
		f.Verdict = Warn
	}
	if v.Header != "" {
		f.Got += ", header " + v.Header
		if v.Header == HeaderShared {
			f.Verdict = Fail
		}
	}
	a.mu.Lock()
	a.r.Salts = append(a.r.Salts, v)
	a.r.add(f)
	a.mu.Unlock()
}

// saltPrompt is saltNonce random ids, then filler, then one last id that variant changes.
func (a *auditor) saltPrompt() []int {
	n := min(saltPromptTokens, max(a.limit/2, saltNonce+2))
	ids := make([]int, n)
	var b [2]byte
	for i := range ids {
		if i < saltNonce {
			_, _ = rand.Read(b[:])
			ids[i] = 1000 + int(binary.BigEndian.Uint16(b[:]))%20000 // valid in every common vocabulary
		} else {
			ids[i] = a.sz.fillerID
		}
	}
	return ids
}

// variant is ids with its last token made the k-th of its kind: three probes of one prefix
// differ at the end, so none is a whole-prompt repeat.
func variant(ids []int, k int) []int {
	out := append([]int(nil), ids...)
	out[len(out)-1] = 1000 + 7*k
	return out
}

func newSalt() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "kvgate-audit-" + hex.EncodeToString(b[:])
}

// cachedTokens reads a reply's cached-token figure: OpenAI's usage.prompt_tokens_details, or
// SGLang's meta_info.cached_tokens (native).
func cachedTokens(raw []byte) *int {
	var r struct {
		Usage *struct {
			Details *struct {
				Cached *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Meta *struct {
			Cached *int `json:"cached_tokens"`
		} `json:"meta_info"`
	}
	if json.Unmarshal(raw, &r) != nil {
		return nil
	}
	switch {
	case r.Usage != nil && r.Usage.Details != nil && r.Usage.Details.Cached != nil:
		return r.Usage.Details.Cached
	case r.Meta != nil && r.Meta.Cached != nil:
		return r.Meta.Cached
	}
	return nil
}

func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
