package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/audit"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// The pair of the incident, at a small scale: the prefill pool (2,048 tokens, max_req_input_len
// 2,042) is far smaller than the context (8,192); decode's pool holds a prompt of the window.
func startAuditPair(t *testing.T, extra ...string) (prefill, decode *procs.Sim) {
	t.Helper()
	common := append([]string{"--context-length", "8192", "--bug", "admit-rejected", "--quiet"}, extra...)
	prefill = procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "2048", "--bootstrap-port", "0"}, common...)...)
	decode = procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "8192"}, common...)...)
	return prefill, decode
}

type auditRun struct {
	code   int
	stdout []byte
	stderr []byte
	report audit.Report
}

// runAuditCmd runs the built binary's `kvgate audit ARGS` and, with --json, decodes its report.
func runAuditCmd(t *testing.T, args ...string) auditRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, procs.Binary(t), append([]string{"audit"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := auditRun{stdout: out.Bytes(), stderr: errb.Bytes()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("kvgate audit: %v\n%s", err, errb.Bytes())
	}
	if ctx.Err() != nil {
		t.Fatalf("kvgate audit did not finish in 30s\nstderr:\n%s", errb.Bytes())
	}
	for _, a := range args {
		if a == "--json" {
			if err := json.Unmarshal(r.stdout, &r.report); err != nil {
				t.Fatalf("--json output is not a report: %v\n%s", err, r.stdout)
			}
		}
	}
	return r
}

func (r auditRun) findings(kind, verdict string) []audit.Finding {
	var out []audit.Finding
	for _, f := range r.report.Findings {
		if (kind == "" || f.Kind == kind) && (verdict == "" || f.Verdict == verdict) {
			out = append(out, f)
		}
	}
	return out
}

func (r auditRun) finding(t *testing.T, check string) audit.Finding {
	t.Helper()
	for _, f := range r.report.Findings {
		if f.Check == check {
			return f
		}
	}
	t.Fatalf("no finding %q in:\n%s", check, r.stdout)
	return audit.Finding{}
}

func (r auditRun) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// The buggy pair, audited directly: over-limit prompts in the window are admitted and their
// replies quote the warm-up requests' markers.
func TestAuditPDBugFindsLeak(t *testing.T) {
	p, d := startAuditPair(t)
	r := runAuditCmd(t, "--prefill", p.URL, "--decode", d.URL, "--json")
	if r.code != audit.ExitFindings {
		t.Fatalf("want exit 1 on the leaking pair, got %v", r)
	}
	if r.report.Limit != 2042 || r.report.LimitSource != "max_req_input_len" || r.report.Sizing != audit.SizingTokenize {
		t.Fatalf("limit %d from %q, sizing %q: want 2042 from max_req_input_len by tokenize", r.report.Limit, r.report.LimitSource, r.report.Sizing)
	}
	if f := r.finding(t, "mismatch/prefill"); f.Verdict != audit.Warn || f.Got != "context 8192 > pool 2048" {
		t.Fatalf("mismatch/prefill: %+v", f)
	}
	if f := r.finding(t, "refusal/window"); f.Verdict != audit.Fail || f.Status != 200 || f.Tokens != 5117 || !f.Exact {
		t.Fatalf("refusal/window: want an exact 5117-token prompt admitted with 200, a fail: %+v", f)
	}
	leaks := r.findings(audit.KindIsolation, audit.Fail)
	if len(leaks) == 0 {
		t.Fatalf("want an isolation finding: %v", r)
	}
	// Every marker reported was one a warm-up request really sent, and the reply shows it.
	warm := map[string]bool{}
	for _, f := range r.findings(audit.KindIsolation, audit.Pass) {
		if strings.HasPrefix(f.Check, "isolation/warm-up-") {
			warm[f.Check] = true
		}
	}
	for _, f := range leaks {
		if len(f.Markers) == 0 || f.Status != 200 {
			t.Fatalf("an isolation finding names its markers and the 200 that carried them: %+v", f)
		}
		for _, m := range f.Markers {
			if !warm[m.Warmup] || !strings.HasPrefix(m.Marker, "kvaudit-") || m.Where == "" {
				t.Fatalf("marker %+v does not come from an accepted warm-up (%v)", m, warm)
			}
		}
		if !strings.Contains(f.Excerpt, f.Markers[0].Marker[:16]) {
			t.Fatalf("the excerpt should show the marker: %+v", f)
		}
	}
	// Past the context the engine's own context check refuses, bug or not.
	if f := r.finding(t, "refusal/far-over/stream"); f.Verdict != audit.Pass || f.Status != 400 {
		t.Fatalf("refusal/far-over/stream: %+v", f)
	}
	if r.report.TokensSent <= 0 || r.report.TokensSent > r.report.Budget {
		t.Fatalf("tokens sent %d, budget %d", r.report.TokensSent, r.report.Budget)
	}

	// The JSON shape, as documented, on the raw document.
	var raw struct {
		Target   *string          `json:"target"`
		Findings []map[string]any `json:"findings"`
		ExitCode *int             `json:"exit_code"`
	}
	if err := json.Unmarshal(r.stdout, &raw); err != nil || raw.Target == nil || raw.ExitCode == nil || *raw.ExitCode != 1 {
		t.Fatalf("top level: %v %s", err, r.stdout)
	}
	kinds := map[string]bool{"refusal": true, "isolation": true, "mismatch": true, "salt": true}
	verdicts := map[string]bool{"pass": true, "warn": true, "fail": true}
	for _, f := range raw.Findings {
		c, _ := f["check"].(string)
		k, _ := f["kind"].(string)
		v, _ := f["verdict"].(string)
		if c == "" || !kinds[k] || !verdicts[v] {
			t.Fatalf("finding %v: want check, kind in refusal|isolation|mismatch|salt, verdict in pass|warn|fail", f)
		}
	}

	// The table, for a person: aligned columns, the leak row, where the marker came from.
	r = runAuditCmd(t, "--prefill", p.URL, "--decode", d.URL)
	if r.code != audit.ExitFindings {
		t.Fatalf("table run: %v", r)
	}
	for _, re := range []string{
		`(?m)^CHECK +SENT +EXPECTED +GOT +VERDICT$`,
		`(?m)^refusal/window +5117 tokens +4xx +200 \(prefill 200\) +FAIL$`,
		`(?m)^isolation/window +5117 tokens +no warm-up marker +[0-9]+ warm-up marker\(s\) +FAIL$`,
		`(?m)^ +marker kvaudit-[a-z2-7]{16} from isolation/warm-up-[1-4] \(`,
	} {
		if !regexp.MustCompile(re).Match(r.stdout) {
			t.Fatalf("table: no line matching %s in\n%s", re, r.stdout)
		}
	}
	if !bytes.Contains(r.stderr, []byte("[1/14] isolation/warm-up-1")) {
		t.Fatalf("want a progress line per step on stderr:\n%s", r.stderr)
	}
}

// With the engine fix that refuses at admission, every over-limit prompt gets a 400, over the
// OpenAI API and the native one with input_ids alike; the pool/context mismatch stays a warning.
func TestAuditPDRejectAtAdmissionPasses(t *testing.T) {
	p, d := startAuditPair(t, "--fix", "reject-at-admission")
	for _, native := range []bool{false, true} {
		args := []string{"--prefill", p.URL, "--decode", d.URL, "--json"}
		if native {
			args = append(args, "--native")
		}
		r := runAuditCmd(t, args...)
		if r.code != audit.ExitPass || len(r.findings("", audit.Fail)) != 0 {
			t.Fatalf("native=%v: want exit 0 and no failure: %v", native, r)
		}
		if f := r.finding(t, "refusal/window/stream"); f.Status != 400 || f.Verdict != audit.Pass {
			t.Fatalf("native=%v: refusal/window/stream: %+v", native, f)
		}
		if f := r.finding(t, "refusal/limit-1"); f.Status != 200 || f.Tokens != 2041 {
			t.Fatalf("native=%v: the largest prompt that fits must be admitted: %+v", native, f)
		}
		if f := r.finding(t, "isolation"); f.Verdict != audit.Pass {
			t.Fatalf("native=%v: isolation: %+v", native, f)
		}
		if len(r.findings(audit.KindMismatch, audit.Warn)) != 1 {
			t.Fatalf("native=%v: the prefill's context > pool is still a warning: %v", native, r)
		}
		want := audit.SizingTokenize
		if native {
			want = audit.SizingInputIDs
		}
		if r.report.Sizing != want {
			t.Fatalf("native=%v: sizing %q, want %q", native, r.report.Sizing, want)
		}
	}
}

// kvgate in front of the buggy pair: the audit sees only the gateway (no /server_info; its
// /tokenize, passed to an engine with the tenant's key, makes sizes exact), and every over-limit
// prompt is refused before an engine sees it.
func TestAuditGatewayInFrontOfBuggyPairPasses(t *testing.T) {
	p, d := startAuditPair(t)
	const key = "sk-audit-test"
	cfg := testkit.ParseConfig(t, fmt.Sprintf(`backends:
  - {name: p0, url: %q, role: prefill}
  - {name: d0, url: %q, role: decode}
tenants:
  - {name: auditor, key_sha256: %q}
capacity: {poll_interval: 200ms}
`, p.URL, d.URL, testkit.KeySHA256(key)))
	gw := testkit.StartGateway(t, cfg)

	if r := runAuditCmd(t, "--target", gw.URL, "--json"); r.code != audit.ExitUnauditable || !strings.Contains(r.report.Error, "--api-key") {
		t.Fatalf("without the key: want exit 2 naming --api-key: %v", r)
	}
	r := runAuditCmd(t, "--target", gw.URL, "--api-key", key, "--json")
	if r.code != audit.ExitPass || len(r.findings("", audit.Fail)) != 0 {
		t.Fatalf("want exit 0 through the gateway: %v", r)
	}
	// kvgate's /v1/models reports the largest prompt it admits (2041); 2042 must be refused.
	if r.report.Limit != 2041 || r.report.LimitSource != "max_model_len" || r.report.Sizing != audit.SizingTokenize {
		t.Fatalf("limit %d from %q sizing %q", r.report.Limit, r.report.LimitSource, r.report.Sizing)
	}
	if f := r.finding(t, "refusal/limit+1/stream"); f.Status != 413 || f.Verdict != audit.Pass {
		t.Fatalf("refusal/limit+1/stream: %+v", f)
	}
	if f := r.finding(t, "refusal/far-over"); f.Status != 413 {
		t.Fatalf("refusal/far-over: %+v", f)
	}
	if f := r.finding(t, "isolation"); f.Verdict != audit.Pass {
		t.Fatalf("isolation: %+v", f)
	}
	// Ground truth from the engine: the bug was never reached.
	if st := p.Stats(t); st.Rejected["pool_admitted_stub"] != 0 || st.MaxPromptTokens >= 2042 {
		t.Fatalf("the prefill saw an over-limit prompt: %+v", st)
	}
}

// zero-on-release leaves the refusal bug in place (over-limit prompts are still admitted), but
// a reply reads cleared pages, so no warm-up marker can come back.
func TestAuditZeroOnReleaseNoIsolationFinding(t *testing.T) {
	p, d := startAuditPair(t, "--fix", "zero-on-release")
	r := runAuditCmd(t, "--prefill", p.URL, "--decode", d.URL, "--json")
	if r.code != audit.ExitFindings {
		t.Fatalf("the refusal path is still broken: want exit 1: %v", r)
	}
	if leaks := r.findings(audit.KindIsolation, audit.Fail); len(leaks) != 0 {
		t.Fatalf("zero-on-release: want no isolation finding, got %+v", leaks)
	}
	if f := r.finding(t, "refusal/window"); f.Verdict != audit.Fail || f.Status != 200 {
		t.Fatalf("refusal/window: %+v", f)
	}
	// The replies looked at include the six admitted over-limit ones (window, limit+1 and limit,
	// both ways; far-over meets the context check), so "no marker" means something.
	if f := r.finding(t, "isolation"); f.Verdict != audit.Pass || !strings.Contains(f.Got, "6 at or over the limit") {
		t.Fatalf("isolation: %+v", f)
	}
}

// A target that is gone cannot be audited: exit 2, saying so, in both output forms.
func TestAuditStoppedTargetExit2(t *testing.T) {
	s := procs.StartSim(t, "--quiet")
	s.Stop()
	r := runAuditCmd(t, "--target", s.URL, "--json")
	if r.code != audit.ExitUnauditable || !strings.Contains(r.report.Error, "unreachable") || len(r.report.Findings) != 0 {
		t.Fatalf("want exit 2 and an unreachable error: %v", r)
	}
	r = runAuditCmd(t, "--target", s.URL)
	if r.code != audit.ExitUnauditable || !bytes.Contains(r.stdout, []byte("cannot audit: target unreachable")) {
		t.Fatalf("table form: %v", r)
	}
}
