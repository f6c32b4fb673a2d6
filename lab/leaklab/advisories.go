package leaklab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/fingerprint"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"go.uber.org/zap"
)

// ExperimentAdvisories replays vLLM's two advisories of 2026-11-09 on a simulated engine behind
// a real gateway (in process, default settings with canaries on) and counts, per bug, the
// replies that carried another tenant's state and how many of them the gateway cut or recorded.
// Timing decides which requests share the engine's batch, so its figures vary from run to run
// (unlike the page-level experiments, it is not in `all`); each row's invariants do not.
const ExperimentAdvisories = "advisories"

// AdvisoryParams configure the advisories experiment.
type AdvisoryParams struct {
	Requests    int           // per row; default 200
	Tenants     int           // default 8
	Concurrency int           // requests in flight; default 4
	Words       int           // words of each prompt; default 120
	MaxTokens   int           // output asked of each request; default 48
	Residues    []int         // the residue lengths (tokens) of batch-slot-residue's rows; default 4, 16, 32
	TokenDelay  time.Duration // the engine's time per token (so requests overlap); default 2 ms
	Seed        uint64
}

// DefaultAdvisoryParams are the defaults above.
func DefaultAdvisoryParams() AdvisoryParams {
	return AdvisoryParams{Requests: 200, Tenants: 8, Concurrency: 4, Words: 120, MaxTokens: 48,
		Residues: []int{4, 16, 32}, TokenDelay: 2 * time.Millisecond, Seed: 1}
}

// AdvisoryRow is one bug (and variant) over Requests requests.
type AdvisoryRow struct {
	Bug     string `json:"bug"`
	Variant string `json:"variant"`
	// Requests sent; Refused by the gateway before any engine saw them (4xx other than a cut).
	Requests int `json:"requests"`
	Refused  int `json:"refused"`
	// Leaking: replies the engine put another tenant's state into (its ground truth). Cut: of
	// those, the replies the gateway cut (502, or an error event in a stream); Recorded: with an
	// incident for the request. Detected: cut or recorded.
	Leaking  int `json:"leaking"`
	Cut      int `json:"cut"`
	Recorded int `json:"recorded"`
	Detected int `json:"detected"`
	// Weak: replies the gateway saw 1 to cut_matches−1 foreign fingerprints in
	// (kvgate_fingerprint_weak_total): logged, no incident, not cut. Tenants share no text here,
	// so a weak match is a leaking reply's.
	Weak       int      `json:"weak"`
	DetectRate *float64 `json:"detect_rate"` // detected / leaking; null with no leak
	// MaxVictimRun is the longest run of a victim's prompt text (folded: letters and digits,
	// lower case) that reached a client in any leaking reply; Bound is fingerprint.MaxQuoted of
	// the default cut_matches, the most the gateway documents letting through.
	MaxVictimRun int `json:"max_victim_run"`
	Bound        int `json:"bound"`
	// LeakedText is a sample of what leaked (the engine's ground truth), for the table.
	LeakedText string `json:"leaked_text,omitempty"`
}

// RunAdvisories runs the rows: batch-slot-residue at each residue length, forced-reasoning-end
// with the budget sent by clients and with the deployment's default budget.
func (p AdvisoryParams) RunAdvisories(progress Progress) (*Report, error) {
	if p.Requests < 1 || p.Tenants < 2 || p.Concurrency < 1 || p.Words < 10 || p.MaxTokens < 1 {
		return nil, fmt.Errorf("advisories: requests ≥ 1, tenants ≥ 2, concurrency ≥ 1, words ≥ 10 and max-tokens ≥ 1")
	}
	type variant struct {
		bug, name string
		cfg       enginesim.Config
		budget    int // thinking_token_budget sent by clients
	}
	var vs []variant
	for _, r := range p.Residues {
		vs = append(vs, variant{kvmodel.BugBatchSlotResidue, fmt.Sprintf("residue %d tokens", r),
			enginesim.Config{Bug: kvmodel.BugBatchSlotResidue, ResidueTokens: r}, 0})
	}
	vs = append(vs,
		variant{kvmodel.BugForcedReasoningEnd, "clients send thinking_token_budget",
			enginesim.Config{Bug: kvmodel.BugForcedReasoningEnd}, p.MaxTokens / 4},
		variant{kvmodel.BugForcedReasoningEnd, "the engine's default budget (--thinking-budget)",
			enginesim.Config{Bug: kvmodel.BugForcedReasoningEnd, ThinkBudget: p.MaxTokens / 4}, 0})
	rep := &Report{Experiment: ExperimentAdvisories, Params: map[string]any{
		"requests": p.Requests, "tenants": p.Tenants, "concurrency": p.Concurrency, "words": p.Words,
		"max_tokens": p.MaxTokens, "residues": p.Residues, "token_delay_ms": p.TokenDelay.Milliseconds(), "seed": p.Seed,
		"gateway": "default settings, canary.enabled with a secret, one engine, no Redis"}}
	for i, v := range vs {
		v.cfg.TokenDelay, v.cfg.Seed = p.TokenDelay, p.Seed
		row, err := p.runAdvisory(v.bug, v.name, v.cfg, v.budget, uint64(i))
		if err != nil {
			return nil, err
		}
		rep.Rows = append(rep.Rows, row)
		if progress != nil {
			progress(ExperimentAdvisories, i+1, len(vs))
		}
	}
	return rep, nil
}

// advisoryRun is one row's engine, gateway and keys.
type advisoryRun struct {
	p        AdvisoryParams
	base     string
	adminKey string
	words    [][]string // each tenant's vocabulary: tenants share no word, so no text is common
}

var tagRE = regexp.MustCompile(`reqtag([0-9]+)x`)

func (p AdvisoryParams) runAdvisory(bug, name string, ecfg enginesim.Config, budget int, row uint64) (AdvisoryRow, error) {
	out := AdvisoryRow{Bug: bug, Variant: name, Requests: p.Requests, Bound: fingerprint.MaxQuoted(defaultCutMatches)}
	eng, err := enginesim.Start(ecfg)
	if err != nil {
		return out, err
	}
	defer eng.Close()
	r := &advisoryRun{p: p, adminKey: "admin-advisories"}
	var tenants strings.Builder
	for t := 0; t < p.Tenants; t++ {
		fmt.Fprintf(&tenants, "  - {name: t%d, key_sha256: %q}\n", t, config.SHA256Hex(fmt.Sprintf("sk-t%d", t)))
	}
	yaml := fmt.Sprintf(`listen: "127.0.0.1:0"
admin_key_sha256: %q
backends:
  - {name: e0, url: "http://%s", role: unified}
tenants:
%scanary: {enabled: true, secret: "leaklab-advisories-secret-of-32-bytes"}
capacity: {poll_interval: 200ms}
`, config.SHA256Hex(r.adminKey), eng.Addr(), tenants.String())
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		return out, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw, ln, err := gateway.Start(ctx, cfg, zap.NewNop())
	if err != nil {
		return out, err
	}
	defer func() { _ = gw.Shutdown(context.Background()) }()
	r.base = "http://" + ln.Addr().String()
	if err := waitReady(r.base); err != nil {
		return out, err
	}
	rng := rand.New(rand.NewPCG(p.Seed, splitmix(p.Seed^row)))
	for t := 0; t < p.Tenants; t++ {
		r.words = append(r.words, vocabulary(rng, t, 400))
	}

	// The requests: tenant, prompt and route decided up front from the seed.
	type sent struct {
		tenant  int
		prompt  string
		rid     string
		status  int
		text    string
		cut     bool
		refused bool
	}
	reqs := make([]*sent, p.Requests)
	for i := range reqs {
		t := rng.IntN(p.Tenants)
		var b strings.Builder
		fmt.Fprintf(&b, "reqtag%dx", i)
		for w := 0; w < p.Words; w++ {
			b.WriteString(" " + r.words[t][rng.IntN(len(r.words[t]))])
		}
		reqs[i] = &sent{tenant: t, prompt: b.String()}
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < p.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				q := reqs[i]
				q.status, q.rid, q.text, q.cut = r.send(q.tenant, q.prompt, i%2 == 1, i%4 >= 2, budget)
				q.refused = q.status >= 400 && q.status < 500
			}
		}()
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()

	incidents, err := r.incidents()
	if err != nil {
		return out, err
	}
	if out.Weak, err = r.counter("kvgate_fingerprint_weak_total"); err != nil {
		return out, err
	}
	leaked := map[int]enginesim.Leak{} // request → its (first) cross-tenant leak
	for _, l := range eng.Leaks() {
		req, vic := tagOf(l.Prompt), tagOf(l.Victim)
		if req < 0 || req >= len(reqs) || vic < 0 || vic >= len(reqs) || reqs[req].tenant == reqs[vic].tenant {
			continue // the same tenant's own state is no leak between tenants
		}
		if _, ok := leaked[req]; !ok {
			leaked[req] = l
		}
	}
	for i, q := range reqs {
		if q.refused {
			out.Refused++
		}
		l, ok := leaked[i]
		if !ok {
			continue
		}
		out.Leaking++
		if out.LeakedText == "" {
			out.LeakedText = l.Text
		}
		rec := incidents[q.rid]
		if q.cut {
			out.Cut++
		}
		if rec {
			out.Recorded++
		}
		if q.cut || rec {
			out.Detected++
		}
		victim := reqs[tagOf(l.Victim)].prompt
		out.MaxVictimRun = max(out.MaxVictimRun, longestCommon(fold(q.text), fold(victim)))
	}
	if out.Leaking > 0 {
		rate := round6(float64(out.Detected) / float64(out.Leaking))
		out.DetectRate = &rate
	}
	return out, nil
}

// defaultCutMatches is canary.fingerprints.cut_matches' default.
const defaultCutMatches = 3

// send sends one request as tenant t (chat or completions, streamed or not) and returns the
// status, the gateway's request id, the text the client got and whether the reply was cut.
// A 503 after a quarantine is released through the admin API (as an operator would) and sent
// again, so the run goes on.
func (r *advisoryRun) send(t int, prompt string, chat, stream bool, budget int) (int, string, string, bool) {
	body := map[string]any{"model": "sim", "max_tokens": r.p.MaxTokens, "stream": stream, "temperature": 0}
	path := "/v1/completions"
	if chat {
		path, body["messages"] = "/v1/chat/completions", []map[string]string{{"role": "user", "content": prompt}}
	} else {
		body["prompt"] = prompt
	}
	if budget > 0 {
		body["thinking_token_budget"] = budget
	}
	b, _ := json.Marshal(body)
	for try := 0; ; try++ {
		req, _ := http.NewRequest("POST", r.base+path, bytes.NewReader(b))
		req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-t%d", t))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", "", false
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 503 && try < 5 {
			r.release()
			continue
		}
		rid := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != 200 {
			return resp.StatusCode, rid, "", resp.StatusCode == 502 && bytes.Contains(rb, []byte("upstream_integrity"))
		}
		if !stream {
			return 200, rid, replyText(rb), false
		}
		var text strings.Builder
		cut := false
		for _, line := range strings.Split(string(rb), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			if strings.Contains(data, "upstream_integrity") {
				cut = true
				continue
			}
			text.WriteString(replyText([]byte(data)))
		}
		return 200, rid, text.String(), cut
	}
}

// release lifts every quarantine of the one backend.
func (r *advisoryRun) release() {
	req, _ := http.NewRequest("POST", r.base+"/admin/backends/e0/release", nil)
	req.Header.Set("Authorization", "Bearer "+r.adminKey)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

// incidents are the request ids of the gateway's leak incidents.
func (r *advisoryRun) incidents() (map[string]bool, error) {
	req, _ := http.NewRequest("GET", r.base+"/admin/incidents?limit=10000", nil)
	req.Header.Set("Authorization", "Bearer "+r.adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc struct {
		Incidents []struct {
			Kind      string `json:"kind"`
			RequestID string `json:"request_id"`
		} `json:"incidents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, fmt.Errorf("/admin/incidents: %v", err)
	}
	out := map[string]bool{}
	for _, in := range doc.Incidents {
		if in.Kind == "leak" {
			out[in.RequestID] = true
		}
	}
	return out, nil
}

// counter reads one counter of the gateway's /metrics.
func (r *advisoryRun) counter(name string) (int, error) {
	req, _ := http.NewRequest("GET", r.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+r.adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return int(f), nil
			}
		}
	}
	return 0, fmt.Errorf("/metrics has no %s (status %d)", name, resp.StatusCode)
}

// replyText is the text of one reply or event: completions' text, chat's content or delta.
func replyText(b []byte) string {
	var r struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(b, &r) != nil {
		return ""
	}
	var s strings.Builder
	for _, c := range r.Choices {
		s.WriteString(c.Text + c.Message.Content + c.Delta.Content)
	}
	return s.String()
}

func tagOf(prompt string) int {
	m := tagRE.FindStringSubmatch(prompt)
	if m == nil {
		return -1
	}
	n := 0
	fmt.Sscan(m[1], &n)
	return n
}

// vocabulary is n pseudo-words of tenant t's own (its index spelled in every word), so no
// two tenants share a word and no text is common to tenants.
func vocabulary(rng *rand.Rand, t, n int) []string {
	const letters = "bcdfghjklmnpqrstvwz"
	const vowels = "aeiou"
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for k := 0; k < 3; k++ {
			b.WriteByte(letters[rng.IntN(len(letters))])
			b.WriteByte(vowels[rng.IntN(len(vowels))])
		}
		fmt.Fprintf(&b, "%c%c", 'a'+byte(t%26), 'a'+byte(t/26%26))
		out[i] = b.String()
	}
	return out
}

// fold keeps letters and digits, lower-cased: how the detectors read ASCII text (separators
// skipped), so runs are measured in the unit of fingerprint.MaxQuoted.
func fold(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z':
			b.WriteByte(c + 32)
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteByte(c)
		}
	}
	return b.String()
}

// longestCommon is the length of the longest common substring of a and b.
func longestCommon(a, b string) int {
	if len(a) == 0 || len(b) == 0 {
		return 0
	}
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	best := 0
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			if a[i-1] == b[j-1] {
				cur[j] = prev[j-1] + 1
				best = max(best, cur[j])
			} else {
				cur[j] = 0
			}
		}
		prev, cur = cur, prev
	}
	return best
}

func waitReady(base string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
	}
	return fmt.Errorf("gateway not ready after 10s")
}
