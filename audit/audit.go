// Package audit tests a deployment from outside, as a client would: it discovers the advertised
// context and, where reachable, the KV pool behind it; sends prompts just under, at and over the
// limit, streaming and not, and checks that every over-limit prompt is refused with a 4xx; and
// warms the target with requests carrying random markers, then looks for those markers in every
// reply. It speaks HTTP only and imports nothing of the gateway, so it audits any SGLang-style or
// OpenAI-compatible endpoint, a disaggregated pair directly, or kvgate in front of either. It must
// never send more than Options allow (requests, tokens, time, concurrency), nor contact any
// address it was not given.
package audit

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultBudget  = 4_000_000 // prompt tokens per audit: a few probes at a 1M-token limit
	DefaultTimeout = 30 * time.Second
	DefaultMaxTime = 10 * time.Minute
	DefaultWarmups = 4
)

const (
	// warmCap bounds one warm-up prompt: a warm-up only needs to fill a few pages with markers.
	warmCap = 8192
	// probeMaxNew is the output asked of over-limit prompts: if one is wrongly admitted, enough
	// text to quote what its stale KV holds (the simulator samples its context in runs of 16).
	probeMaxNew = 64
	warmMaxNew  = 8
)

// Options configure one audit. Give Target, or Prefill and Decode.
type Options struct {
	Target  string // one endpoint: an engine, or a gateway in front of engines
	Prefill string // or a disaggregated pair, which the audit drives as a PD router does
	Decode  string
	APIKey  string // sent as "Authorization: Bearer KEY" to every endpoint
	Model   string // model name in requests; default: the first /v1/models entry
	// Native uses SGLang's /generate with input_ids (exact sizes without /tokenize) instead of
	// OpenAI's /v1/completions with text.
	Native bool
	// Limit is the smallest prompt, in tokens, the target must refuse; 0 = discover it.
	Limit int
	// Budget caps the prompt tokens of all generation requests (a PD request counts once);
	// probes that would pass it are skipped and reported. Default DefaultBudget.
	Budget      int
	Concurrency int           // requests in flight at once; default 1
	Timeout     time.Duration // per request, reply read whole; default DefaultTimeout
	MaxTime     time.Duration // for the whole audit; default DefaultMaxTime
	Warmups     int           // marked warm-up requests, sent one at a time; default DefaultWarmups; <0 = none
	// The salt checks (salt.go): NoSalts skips them. Through kvgate, SecondKey is another
	// tenant's key (the gateway salts per tenant), and AdminKey lists its backends for one
	// verdict each.
	NoSalts   bool
	SecondKey string
	AdminKey  string
	Progress  func(line string)
}

func (o *Options) defaults() {
	if o.Budget == 0 {
		o.Budget = DefaultBudget
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxTime == 0 {
		o.MaxTime = DefaultMaxTime
	}
	if o.Warmups == 0 {
		o.Warmups = DefaultWarmups
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
}

// Run audits the target and returns the report; it never returns nil. Report.ExitCode says how
// it went, and Report.Error why the target could not be audited.
func Run(ctx context.Context, o Options) *Report {
	o.defaults()
	r := &Report{Budget: o.Budget, API: "/v1/completions"}
	if o.Native {
		r.API = "/generate"
	}
	a := &auditor{o: o, r: r}
	if err := a.run(ctx); err != nil {
		r.Error = err.Error()
	} else if ctx.Err() != nil {
		// Interrupted: the findings so far are reported, but the audit is not complete.
		r.Error = "interrupted before the audit finished"
	}
	r.finish()
	return r
}

type auditor struct {
	o   Options
	r   *Report
	c   *client
	snd *sender
	sz  *sizer
	eps []endpoint

	limit       int
	strictLimit bool // a prompt of exactly limit tokens must be refused (see judge)
	context     int

	mu    sync.Mutex // guards r.Findings, spent and step while requests run concurrently
	spent int
	step  int
	steps int
	warm  []warmup
}

// warmup is one accepted marked request.
type warmup struct {
	check, marker, where string
}

func (a *auditor) run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.o.MaxTime)
	defer cancel()
	if err := a.setup(); err != nil {
		return err
	}
	if err := a.discover(ctx); err != nil {
		return err
	}
	a.mismatch()
	// Salt probes first: small, admitted prompts under fresh prefixes, which the refusal probes'
	// filler would otherwise share.
	a.saltChecks(ctx)
	over, under := a.plan()
	a.steps = max(a.o.Warmups, 0) + len(over) + len(under)
	a.warmUp(ctx)
	// Under-limit prompts go last: they are admitted, and their pages would overwrite the
	// warm-up's before an over-limit prompt could read them.
	a.probe(ctx, over)
	a.probe(ctx, under)
	a.isolationSummary()
	return nil
}

func (a *auditor) setup() error {
	o := a.o
	switch {
	case o.Target != "" && (o.Prefill != "" || o.Decode != ""):
		return errors.New("give --target, or --prefill and --decode, not both")
	case o.Target == "" && (o.Prefill == "" || o.Decode == ""):
		return errors.New("give --target URL, or --prefill URL and --decode URL")
	case o.Concurrency < 1:
		return errors.New("--concurrency must be at least 1")
	case o.Budget < 0 || o.Limit < 0:
		return errors.New("--budget and --limit must not be negative")
	}
	a.c = newClient(o.APIKey, o.Timeout, o.Concurrency)
	a.snd = &sender{c: a.c, native: o.Native}
	if o.Target != "" {
		base, err := parseBase("--target", o.Target)
		if err != nil {
			return err
		}
		a.eps = []endpoint{{role: "target", base: base}}
		a.snd.target = &a.eps[0]
		a.r.Target = base
		return nil
	}
	p, err := parseBase("--prefill", o.Prefill)
	if err != nil {
		return err
	}
	d, err := parseBase("--decode", o.Decode)
	if err != nil {
		return err
	}
	a.eps = []endpoint{{role: "prefill", base: p}, {role: "decode", base: d}}
	a.snd.prefill, a.snd.decode = &a.eps[0], &a.eps[1]
	// The bootstrap host is the prefill's own host as given, never an address learnt elsewhere.
	u, _ := url.Parse(p)
	a.snd.bootstrapHost = u.Hostname()
	a.r.Target = p + " (prefill) + " + d + " (decode)"
	return nil
}

func (a *auditor) discover(ctx context.Context) error {
	for _, ep := range a.eps {
		s, err := a.c.discover(ctx, ep, a.o.Model)
		if err != nil {
			return err
		}
		a.r.Servers = append(a.r.Servers, s)
	}
	model := a.o.Model
	mril, tok := 0, -1
	for i, s := range a.r.Servers {
		if model == "" {
			model = s.Model
		}
		if s.Context > 0 && (a.context == 0 || s.Context < a.context) {
			a.context = s.Context
		}
		if s.MaxReqInputLen > 0 && (mril == 0 || s.MaxReqInputLen < mril) {
			mril = s.MaxReqInputLen
		}
		if s.Tokenize && tok < 0 {
			tok = i
		}
	}
	if model == "" {
		model = "default"
	}
	a.r.Context = a.context
	if a.snd.prefill != nil {
		p, d := a.r.Servers[0], &a.r.Servers[1]
		a.snd.bootstrapPort = p.BootstrapPort
		if p.Mode != "" && p.Mode != "prefill" {
			a.r.Servers[0].Notes = append(a.r.Servers[0].Notes, fmt.Sprintf("reports disaggregation_mode %q, not prefill", p.Mode))
		}
		if d.Mode != "" && d.Mode != "decode" {
			d.Notes = append(d.Notes, fmt.Sprintf("reports disaggregation_mode %q, not decode", d.Mode))
		}
	}

	// The limit is the smallest prompt that must be refused. SGLang refuses prompt ≥
	// max_req_input_len and prompt ≥ context; kvgate's /v1/models reports the largest prompt it
	// admits instead, so a limit known only from max_model_len is not strict at exactly itself.
	switch {
	case a.o.Limit > 0:
		a.limit, a.strictLimit, a.r.LimitSource = a.o.Limit, true, "--limit"
	case mril > 0 && (a.context == 0 || mril <= a.context):
		a.limit, a.strictLimit, a.r.LimitSource = mril, true, "max_req_input_len"
	case a.context > 0:
		a.limit, a.strictLimit, a.r.LimitSource = a.context, mril > 0, "max_model_len"
	default:
		return errors.New("no discoverable limit: neither /v1/models (max_model_len) nor /server_info " +
			"(max_req_input_len) gave one; give it with --limit N (the smallest prompt, in tokens, the target must refuse)")
	}
	if a.limit < 2 {
		return fmt.Errorf("limit %d is too small to audit", a.limit)
	}
	a.r.Limit = a.limit

	a.sz = &sizer{fillerID: defaultFillerID}
	if tok >= 0 {
		base := a.eps[tok].base
		a.sz.count = func(ctx context.Context, text string) ([]int, error) { return a.c.count(ctx, base, model, text) }
	}
	switch {
	case a.o.Native:
		a.sz.method = SizingInputIDs
		if a.sz.count != nil {
			// The filler's own id, so an engine decodes input_ids to the same text as elsewhere.
			if ids, err := a.sz.count(ctx, fillerUnit); err == nil && len(ids) > 0 {
				a.sz.fillerID = ids[len(ids)-1]
			}
		}
	case a.sz.count != nil:
		a.sz.method = SizingTokenize
	default:
		a.sz.method = SizingEstimate
	}
	a.r.Sizing = a.sz.method
	a.snd.model = model
	return nil
}

// mismatch reports, per server, an advertised context larger than its KV pool.
func (a *auditor) mismatch() {
	for _, s := range a.r.Servers {
		if s.Pool <= 0 || s.Context <= 0 {
			continue
		}
		f := Finding{Check: "mismatch/" + s.Role, Kind: KindMismatch, Sent: "-", Expected: "context ≤ pool"}
		if s.Context > s.Pool {
			f.Verdict, f.Got = Warn, fmt.Sprintf("context %d > pool %d", s.Context, s.Pool)
			f.Detail = fmt.Sprintf("%s advertises %d tokens of context over a %d-token KV pool: prompts from "+
				"max_req_input_len (%d) up to the context pass the context check and meet only the pool check, "+
				"the window of the disaggregation leak", s.URL, s.Context, s.Pool, s.MaxReqInputLen)
		} else {
			f.Verdict, f.Got = Pass, fmt.Sprintf("context %d ≤ pool %d", s.Context, s.Pool)
		}
		a.r.add(f)
	}
}

func (a *auditor) progress(check, what string) {
	a.mu.Lock()
	a.step++
	line := fmt.Sprintf("[%d/%d] %s: %s", a.step, a.steps, check, what)
	a.mu.Unlock()
	a.o.Progress(line)
}

// reserve takes n tokens from the budget, or reports that they would pass it.
func (a *auditor) reserve(n int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.spent+n > a.o.Budget {
		return false
	}
	a.spent += n
	a.r.TokensSent = a.spent
	return true
}

func (a *auditor) add(f Finding) {
	a.mu.Lock()
	a.r.add(f)
	a.mu.Unlock()
}

// body is a generation request for p asking for maxNew tokens, in the API in use.
func (a *auditor) body(p prompt, maxNew int) map[string]any {
	if a.o.Native {
		b := map[string]any{"sampling_params": map[string]any{"max_new_tokens": maxNew, "temperature": 0}}
		if p.ids != nil {
			b["input_ids"] = p.ids
		} else {
			b["text"] = p.text
		}
		return b
	}
	return map[string]any{"model": a.snd.model, "prompt": p.text, "max_tokens": maxNew, "temperature": 0}
}

func sentText(p prompt, stream bool) string {
	s := tokensText(p) + " tokens"
	if stream {
		s += ", stream"
	}
	return s
}

// warmUp sends the marked requests, largest first: each later, smaller one overwrites only part
// of the pages the earlier ones freed, so every marker survives somewhere in the pool.
func (a *auditor) warmUp(ctx context.Context) {
	n := a.o.Warmups
	if n <= 0 {
		return
	}
	base := min(a.limit-1, warmCap) * 9 / 10
	for i := 0; i < n && ctx.Err() == nil; i++ {
		check := fmt.Sprintf("isolation/warm-up-%d", i+1)
		size := max(base*(n-i)/n, 1)
		marker := newMarker()
		f := Finding{Check: check, Kind: KindIsolation, Expected: "2xx", Sent: "-"}
		p, err := a.sz.warm(ctx, marker, size)
		if err != nil {
			f.Verdict, f.Got, f.Detail = Warn, "not sent", err.Error()
			a.add(f)
			continue
		}
		f.Sent, f.Tokens, f.Exact = sentText(p, false)+" of marker", p.tokens, p.exact
		if !a.reserve(p.tokens) {
			f.Verdict, f.Got, f.Detail = Warn, "not sent", "over --budget"
			a.add(f)
			continue
		}
		a.progress(check, tokensText(p)+" tokens")
		res := a.snd.send(ctx, a.body(p, warmMaxNew), false)
		f.Status, f.Got = res.status, gotText(res)
		if res.err == nil && res.status >= 200 && res.status <= 299 {
			f.Verdict = Pass
			a.warm = append(a.warm, warmup{check: check, marker: marker,
				where: fmt.Sprintf("%d tokens, %s %s, %s", p.tokens, a.snd.path(), a.endpointsText(), time.Now().UTC().Format("15:04:05"))})
		} else {
			f.Verdict, f.Detail = Warn, "warm-up not accepted: the isolation probe has less to find"
		}
		a.add(f)
		// A warm-up reply quoting an earlier warm-up is a leak between admitted requests.
		a.scan(check, p, false, res, marker)
	}
}

func (a *auditor) endpointsText() string {
	if a.snd.target != nil {
		return a.snd.target.base
	}
	return "prefill+decode"
}

// probe is one prompt size sent one way.
type probe struct {
	check  string
	size   int
	stream bool
}

// plan lists the refusal probes: over-limit ones (the window between pool and context first,
// the incident's case) and under-limit ones, each non-streamed and streamed.
func (a *auditor) plan() (over, under []probe) {
	both := func(dst []probe, name string, size int) []probe {
		return append(dst, probe{"refusal/" + name, size, false}, probe{"refusal/" + name + "/stream", size, true})
	}
	// The window exists when the pool, not the context, sets the limit.
	if a.context > 0 && a.context-a.limit >= 4 {
		over = both(over, "window", a.limit+(a.context-a.limit)/2)
	} else if a.r.LimitSource == "max_model_len" {
		a.r.Notes = append(a.r.Notes, "no window probe: no pool was discoverable, so the limit is the advertised context")
	}
	over = both(over, "limit+1", a.limit+1)
	over = both(over, "limit", a.limit)
	over = both(over, "far-over", 2*max(a.context, a.limit))
	under = both(under, "limit-1", a.limit-1)
	return over, under
}

// probe sends probes with at most Concurrency in flight. Prompts are built and the budget is
// reserved in order first, so which probes a budget skips does not depend on timing.
func (a *auditor) probe(ctx context.Context, probes []probe) {
	type job struct {
		pr probe
		p  prompt
		f  Finding
		ok bool
	}
	jobs := make([]*job, len(probes))
	cache := map[int]prompt{}
	for i, pr := range probes {
		j := &job{pr: pr, f: Finding{Check: pr.check, Kind: KindRefusal, Stream: pr.stream}}
		jobs[i] = j
		p, ok := cache[pr.size]
		if !ok {
			var err error
			if p, err = a.sz.filler(ctx, pr.size); err != nil {
				j.f.Sent, j.f.Expected, j.f.Verdict, j.f.Got, j.f.Detail = "-", "4xx", Warn, "not sent", err.Error()
				continue
			}
			cache[pr.size] = p
		}
		j.p = p
		j.f.Sent, j.f.Tokens, j.f.Exact = sentText(p, pr.stream), p.tokens, p.exact
		j.f.Expected = a.expected(p.tokens)
		if !a.reserve(p.tokens) {
			j.f.Verdict, j.f.Got, j.f.Detail = Warn, "not sent", fmt.Sprintf("%d tokens would pass --budget %d", p.tokens, a.o.Budget)
			continue
		}
		j.ok = true
	}
	results := make([]result, len(jobs))
	sem := make(chan struct{}, a.o.Concurrency)
	var wg sync.WaitGroup
	for i, j := range jobs {
		if !j.ok {
			continue
		}
		sem <- struct{}{}
		if ctx.Err() != nil {
			// Out of time (--max-time) or interrupted: what is left is not sent, and says so.
			<-sem
			j.ok = false
			j.f.Verdict, j.f.Got, j.f.Detail = Warn, "not sent", "the audit ran out of time (--max-time) or was interrupted"
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			a.progress(j.pr.check, fmt.Sprintf("%s tokens", tokensText(j.p)))
			results[i] = a.snd.send(ctx, a.body(j.p, a.maxNew(j.p.tokens)), j.pr.stream)
		}()
	}
	wg.Wait()
	for i, j := range jobs {
		if j.ok {
			res := results[i]
			j.f.Status, j.f.Got = res.status, gotText(res)
			j.f.Verdict, j.f.Detail = judge(j.p.tokens, a.limit, a.strictLimit, j.p.exact, res)
		}
		a.add(j.f)
		if j.ok {
			a.scan(j.pr.check, j.p, j.pr.stream, results[i], "")
		}
	}
}

func tokensText(p prompt) string {
	switch {
	case p.exact:
		return fmt.Sprint(p.tokens)
	case p.bound:
		return fmt.Sprintf("≤%d", p.tokens)
	}
	return fmt.Sprintf("~%d", p.tokens)
}

// maxNew is the output asked for a prompt of n tokens: under the limit, as little as keeps
// prompt + output under the context (some engines refuse prompt + output ≥ context).
func (a *auditor) maxNew(n int) int {
	if n >= a.limit {
		return probeMaxNew
	}
	if a.context > 0 && n+1 >= a.context {
		return 0
	}
	return 1
}

func (a *auditor) expected(tokens int) string {
	switch {
	case tokens < a.limit:
		return "2xx"
	case tokens == a.limit && !a.strictLimit:
		return "4xx or 2xx"
	}
	return "4xx"
}

// scan looks for warm-up markers (other than own) in a reply and reports each reply that has any.
func (a *auditor) scan(check string, p prompt, stream bool, res result, own string) {
	known := make([]string, 0, len(a.warm))
	for _, w := range a.warm {
		if w.marker != own {
			known = append(known, w.marker)
		}
	}
	text := res.text + "\n" + string(res.raw)
	found := findMarkers(text, known)
	if len(found) == 0 {
		return
	}
	f := Finding{Check: "isolation/" + strings.TrimPrefix(check, "refusal/"), Kind: KindIsolation, Verdict: Fail, Sent: sentText(p, stream),
		Tokens: p.tokens, Exact: p.exact, Stream: stream, Status: res.status,
		Expected: "no warm-up marker", Got: fmt.Sprintf("%d warm-up marker(s)", len(found)),
		Excerpt: excerpt(text, found[0])}
	for _, m := range found {
		for _, w := range a.warm {
			if w.marker == m {
				f.Markers = append(f.Markers, Leak{Marker: m, Warmup: w.check, Where: w.where})
			}
		}
	}
	f.Detail = fmt.Sprintf("the HTTP %d reply to %s (%s) quotes text of earlier requests: it read KV that other requests wrote",
		res.status, check, sentText(p, stream))
	a.add(f)
}

// isolationSummary adds one isolation row when no reply leaked, saying what was looked at.
func (a *auditor) isolationSummary() {
	replies, admitted := 0, 0
	for _, f := range a.r.Findings {
		if f.Kind == KindIsolation && f.Verdict == Fail {
			return
		}
		if f.Status != 0 {
			replies++
			if f.Kind == KindRefusal && f.Tokens >= a.limit && f.Status >= 200 && f.Status <= 299 {
				admitted++
			}
		}
	}
	f := Finding{Check: "isolation", Kind: KindIsolation, Sent: "-", Expected: "no warm-up marker"}
	if len(a.warm) == 0 {
		f.Verdict, f.Got, f.Detail = Warn, "not tested", "no warm-up request was accepted, so there were no markers to look for"
	} else {
		f.Verdict = Pass
		f.Got = fmt.Sprintf("none in %d replies (%d at or over the limit)", replies, admitted)
	}
	a.add(f)
}

// gotText says what a request got, in a few words.
func gotText(res result) string {
	var s string
	switch {
	case res.timeout:
		s = "timeout"
	case res.err != nil:
		s = "error: " + res.err.Error()
	default:
		s = fmt.Sprint(res.status)
		if res.streamError != "" {
			s += " + error event"
		}
	}
	if res.prefill != "" {
		s += " (" + res.prefill + ")"
	}
	return s
}

// judge is the verdict on one refusal probe of tokens tokens against limit (the smallest prompt
// that must be refused). exact says whether tokens is a count or an estimate. It is pure.
func judge(tokens, limit int, strictLimit, exact bool, res result) (verdict, detail string) {
	ok := res.err == nil && res.status >= 200 && res.status <= 299
	if tokens < limit {
		switch {
		case res.timeout:
			return Fail, "no reply within the per-request timeout to a prompt under the limit"
		case res.err != nil:
			return Fail, "transport error on a prompt under the limit"
		case ok && res.streamError == "":
			return Pass, ""
		case ok:
			return Warn, "accepted, then an error inside the stream: " + res.streamError
		case res.status == 401 || res.status == 403 || res.status == 404:
			return Warn, notServed(res.status)
		case res.status >= 400 && res.status <= 499:
			return Warn, "refused a prompt under the limit (a gateway may count overhead, such as injected canary markers, on top)"
		}
		return Fail, fmt.Sprintf("HTTP %d on a prompt under the limit", res.status)
	}
	switch {
	case res.timeout:
		return Fail, "no reply within the per-request timeout: an over-limit prompt must be refused at once, not hang"
	case res.err != nil:
		return Fail, "transport error instead of a 4xx: " + res.err.Error()
	case res.status == 429:
		return Warn, "rate-limited (429), which is no refusal of the size: rerun with fewer requests"
	case res.status == 401 || res.status == 403 || res.status == 404:
		return Warn, notServed(res.status)
	case res.status >= 400 && res.status <= 499:
		return Pass, ""
	case ok && tokens == limit && !strictLimit:
		return Pass, "accepted at exactly max_model_len: kvgate advertises the largest prompt it admits, SGLang the context it refuses"
	case ok && !exact && tokens <= limit+1:
		return Warn, "accepted, but the size is an estimate (no /tokenize): rerun with --native for exact sizes"
	case ok:
		return Fail, fmt.Sprintf("a %d-token prompt, over the %d-token limit, was admitted", tokens, limit)
	}
	return Fail, fmt.Sprintf("HTTP %d instead of a 4xx refusal", res.status)
}

// notServed explains a 4xx that refuses the request, not its size: it proves nothing either way.
func notServed(status int) string {
	if status == 404 {
		return "HTTP 404: the target does not serve this route (--native switches between /v1/completions and /generate)"
	}
	return fmt.Sprintf("HTTP %d: refused for authorization, not size; give the key with --api-key", status)
}
