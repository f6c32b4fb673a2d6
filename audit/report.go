package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Finding kinds.
const (
	KindRefusal   = "refusal"   // an over-limit prompt must get a 4xx; an under-limit one should fit
	KindIsolation = "isolation" // no reply may quote another request's text
	KindMismatch  = "mismatch"  // an advertised context larger than the KV pool behind it
	KindSalt      = "salt"      // another salt must not hit a prefix cached under one salt
)

// Verdicts. A warning does not fail the audit; a failure does.
const (
	Pass = "pass"
	Warn = "warn"
	Fail = "fail"
)

// Exit codes of an audit, as `kvgate audit` returns them.
const (
	ExitPass        = 0 // every check passed (warnings allowed)
	ExitFindings    = 1 // at least one check failed
	ExitUnauditable = 2 // the target could not be audited: see Report.Error
)

// Finding is one row of the report.
type Finding struct {
	Check    string `json:"check"`
	Kind     string `json:"kind"`
	Verdict  string `json:"verdict"`
	Sent     string `json:"sent"`              // what was sent ("2042 tokens, streaming"), or "-"
	Expected string `json:"expected"`          // what a safe deployment answers
	Got      string `json:"got"`               // what this one answered
	Tokens   int    `json:"tokens,omitempty"`  // prompt tokens sent, when a prompt was sent
	Exact    bool   `json:"exact,omitempty"`   // Tokens is the target's own count, not an estimate
	Stream   bool   `json:"stream,omitempty"`  // the request asked for a streamed reply
	Status   int    `json:"status,omitempty"`  // HTTP status (decode's, for a PD pair)
	Detail   string `json:"detail,omitempty"`  // why the verdict, or where a leaked marker came from
	Markers  []Leak `json:"markers,omitempty"` // isolation: the warm-up markers found in the reply
	Excerpt  string `json:"excerpt,omitempty"` // isolation: reply text around the first marker
}

// Leak is one warm-up marker found in a reply, and the warm-up request that carried it.
type Leak struct {
	Marker string `json:"marker"`
	Warmup string `json:"warmup"` // the check name of the warm-up request that sent it
	Where  string `json:"where"`  // that request's endpoint(s) and size
}

// Server is what discovery learned about one endpoint.
type Server struct {
	Role           string   `json:"role"` // target | prefill | decode
	URL            string   `json:"url"`
	Model          string   `json:"model,omitempty"`
	OwnedBy        string   `json:"owned_by,omitempty"`          // /v1/models owned_by: "kvgate" names a kvgate gateway
	Context        int      `json:"context,omitempty"`           // /v1/models max_model_len
	Pool           int      `json:"pool,omitempty"`              // /server_info max_total_num_tokens
	MaxReqInputLen int      `json:"max_req_input_len,omitempty"` // /server_info max_req_input_len
	Mode           string   `json:"disaggregation_mode,omitempty"`
	BootstrapPort  int      `json:"bootstrap_port,omitempty"`
	Tokenize       bool     `json:"tokenize"` // answers /tokenize, so prompt sizes are exact
	Notes          []string `json:"notes,omitempty"`
}

// Report is the outcome of one audit.
type Report struct {
	Target      string    `json:"target"`
	API         string    `json:"api"` // the generation endpoint used
	Servers     []Server  `json:"servers,omitempty"`
	Context     int       `json:"context,omitempty"`      // the smallest advertised context
	Limit       int       `json:"limit,omitempty"`        // the smallest prompt that must be refused
	LimitSource string    `json:"limit_source,omitempty"` // max_req_input_len | max_model_len | --limit
	Sizing      string    `json:"sizing,omitempty"`       // how prompt sizes were made: tokenize | input_ids | estimate
	Notes       []string  `json:"notes,omitempty"`        // what the audit could not do, and why
	TokensSent  int       `json:"tokens_sent"`
	Budget      int       `json:"budget"`
	Findings    []Finding `json:"findings"`
	// Salts is each backend's (or PD pair's) salt verdict: isolated | shared | unknown.
	Salts    []SaltVerdict `json:"salts,omitempty"`
	Summary  Summary       `json:"summary"`
	ExitCode int           `json:"exit_code"`
	Error    string        `json:"error,omitempty"` // why the target could not be audited (exit 2)
}

// Summary counts the findings per verdict.
type Summary struct {
	Pass int `json:"pass"`
	Warn int `json:"warn"`
	Fail int `json:"fail"`
}

func (r *Report) add(f Finding) { r.Findings = append(r.Findings, f) }

// finish fills Summary and ExitCode from the findings and Error.
func (r *Report) finish() {
	r.Summary = Summary{}
	for _, f := range r.Findings {
		switch f.Verdict {
		case Pass:
			r.Summary.Pass++
		case Warn:
			r.Summary.Warn++
		case Fail:
			r.Summary.Fail++
		}
	}
	switch {
	case r.Error != "":
		r.ExitCode = ExitUnauditable
	case r.Summary.Fail > 0:
		r.ExitCode = ExitFindings
	default:
		r.ExitCode = ExitPass
	}
	if r.Findings == nil {
		r.Findings = []Finding{} // "findings": [] rather than null, for consumers that iterate
	}
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // "context 8192 > pool 2048" reads as written
	return enc.Encode(r)
}

// WriteTable writes the report for a person: what was discovered, an aligned table of checks,
// then the details of every finding that is not a pass.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kvgate audit: %s via %s\n", r.Target, r.API)
	for _, s := range r.Servers {
		fmt.Fprintf(&b, "  %-7s %s  context %s, pool %s, max_req_input_len %s, /tokenize %s\n", s.Role, s.URL,
			num(s.Context), num(s.Pool), num(s.MaxReqInputLen), yesNo(s.Tokenize))
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "          note: %s\n", n)
		}
	}
	if r.Error != "" {
		fmt.Fprintf(&b, "cannot audit: %s\n", r.Error)
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "  limit %d tokens (from %s); prompt sizes by %s\n", r.Limit, r.LimitSource, r.Sizing)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSENT\tEXPECTED\tGOT\tVERDICT")
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Check, f.Sent, f.Expected, f.Got, strings.ToUpper(f.Verdict))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Salts) > 0 {
		b.WriteString("\nsalt isolation (a repeated prefix: the same salt must hit the cache, another salt must not)\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "BACKEND\tVIA\tSALTS\tCACHED: NEW/SAME/OTHER\tX-CACHE-SALT\tVERDICT")
		for _, v := range r.Salts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s/%s\t%s\t%s\n", v.Backend, v.Via, v.Salts, nump(v.FirstCached), nump(v.SameCached),
				nump(v.OtherCached), dash(v.Header), strings.ToUpper(v.Verdict))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	first := true
	for _, f := range r.Findings {
		if f.Verdict == Pass || (f.Detail == "" && len(f.Markers) == 0) {
			continue
		}
		if first {
			b.WriteString("\n")
			first = false
		}
		fmt.Fprintf(&b, "%s %s: %s\n", strings.ToUpper(f.Verdict), f.Check, f.Detail)
		for _, m := range f.Markers {
			fmt.Fprintf(&b, "    marker %s from %s (%s)\n", m.Marker, m.Warmup, m.Where)
		}
		if f.Excerpt != "" {
			fmt.Fprintf(&b, "    reply: %q\n", f.Excerpt)
		}
	}
	fmt.Fprintf(&b, "\n%d fail, %d warn, %d pass; %d prompt tokens sent (budget %d); exit %d\n",
		r.Summary.Fail, r.Summary.Warn, r.Summary.Pass, r.TokensSent, r.Budget, r.ExitCode)
	_, err := io.WriteString(w, b.String())
	return err
}

func num(n int) string {
	if n <= 0 {
		return "?"
	}
	return fmt.Sprint(n)
}

// nump is a figure that may be missing.
func nump(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
