package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/audit"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// saltVerdicts runs `kvgate audit ARGS --json` with the refusal probes kept small and returns
// the salt verdicts by backend.
func saltVerdicts(t *testing.T, args ...string) (auditRun, map[string]audit.SaltVerdict) {
	t.Helper()
	r := runAuditCmd(t, append(args, "--warmups", "0", "--limit", "4096", "--quiet", "--json")...)
	if r.report.Error != "" {
		t.Fatalf("audit: %v", r)
	}
	out := map[string]audit.SaltVerdict{}
	for _, v := range r.report.Salts {
		out[v.Backend] = v
	}
	return r, out
}

// saltGateway is a gateway in front of the named unified engines (name, URL pairs) with tenants
// t1 (key k1) and t2 (k2) and the admin key adm.
func saltGateway(t *testing.T, engines ...string) *testkit.Gateway {
	t.Helper()
	var b strings.Builder
	b.WriteString("backends:\n")
	for i := 0; i+1 < len(engines); i += 2 {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: unified}\n", engines[i], engines[i+1])
	}
	fmt.Fprintf(&b, "tenants:\n  - {name: t1, key_sha256: %q}\n  - {name: t2, key_sha256: %q}\nadmin_key_sha256: %q\ncapacity: {poll_interval: 200ms}\n",
		testkit.KeySHA256("k1"), testkit.KeySHA256("k2"), testkit.KeySHA256("adm"))
	return testkit.StartGateway(t, testkit.ParseConfig(t, b.String()))
}

func wantSalt(t *testing.T, r auditRun, vs map[string]audit.SaltVerdict, backend, verdict, header string) {
	t.Helper()
	v, ok := vs[backend]
	if !ok || v.Verdict != verdict || v.Header != header {
		t.Fatalf("%s: want %s (header %q), got %+v\n%v", backend, verdict, header, v, r)
	}
}

// Each engine audited directly, by its own salts: the honest one is isolated and says the
// header is ignored (no --salt-header) or isolates (with it); salt-ignored and
// salt-dropped-tier2 are shared; one that reports no cached tokens is unknown, never isolated.
func TestAuditSaltVerdictsDirect(t *testing.T) {
	for _, c := range []struct {
		name, verdict, header string
		args                  []string
		fails                 int // failed salt rows: a shared verdict fails the audit
	}{
		{"honest", audit.SaltIsolated, audit.HeaderIgnored, nil, 0},
		{"honest-header", audit.SaltIsolated, audit.HeaderIsolated, []string{"--salt-header"}, 0},
		{"salt-ignored", audit.SaltShared, audit.HeaderShared, []string{"--bug", "salt-ignored"}, 1},
		{"salt-dropped-tier2", audit.SaltShared, audit.HeaderShared, []string{"--bug", "salt-dropped-tier2", "--salt-header"}, 1},
		{"no-cached-tokens", audit.SaltUnknown, "", []string{"--no-cached-tokens"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			sim := procs.StartSim(t, append([]string{"--quiet"}, c.args...)...)
			for _, native := range []bool{false, true} {
				args := []string{"--target", sim.URL}
				if native {
					args = append(args, "--native")
				}
				r, vs := saltVerdicts(t, args...)
				wantSalt(t, r, vs, sim.URL, c.verdict, c.header)
				if n := len(r.findings(audit.KindSalt, audit.Fail)); n != c.fails || (n > 0 && r.code != audit.ExitFindings) {
					t.Fatalf("%d failed salt rows, want %d\n%v", n, c.fails, r)
				}
			}
		})
	}
}

// A PD pair driven directly as a router does: one verdict for the pair, from both legs'
// figures (a prefill that shares makes the pair shared, whatever decode reports).
func TestAuditSaltVerdictsPDPair(t *testing.T) {
	common := []string{"--context-length", "8192", "--quiet"}
	for _, c := range []struct {
		prefillBug, decodeBug, verdict, header string
	}{
		{"none", "none", audit.SaltIsolated, audit.HeaderIgnored},
		{"salt-ignored", "salt-ignored", audit.SaltShared, audit.HeaderShared},
		{"salt-ignored", "none", audit.SaltShared, audit.HeaderIgnored},
		{"none", "salt-dropped-tier2", audit.SaltShared, audit.HeaderShared},
	} {
		p := procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "2048", "--bootstrap-port", "0", "--bug", c.prefillBug}, common...)...)
		d := procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "8192", "--bug", c.decodeBug}, common...)...)
		r, vs := saltVerdicts(t, "--prefill", p.URL, "--decode", d.URL)
		wantSalt(t, r, vs, p.URL+" + "+d.URL, c.verdict, c.header)
	}
}

// Through kvgate the salt is the tenant's: two tenants' keys compare two salts. One backend
// behind it needs no pin; without --second-key the verdict is unknown (the client's salt is
// replaced, so the audit's own salts prove nothing).
func TestAuditSaltVerdictsThroughGateway(t *testing.T) {
	for _, c := range []struct {
		bug, verdict string
	}{{"none", audit.SaltIsolated}, {"salt-ignored", audit.SaltShared}} {
		t.Run(c.bug, func(t *testing.T) {
			sim := procs.StartSim(t, "--quiet", "--bug", c.bug)
			gw := saltGateway(t, "e0", sim.URL)
			for _, native := range []bool{false, true} {
				args := []string{"--target", gw.URL, "--api-key", "k1", "--second-key", "k2", "--admin-key", "adm"}
				if native {
					args = append(args, "--native")
				}
				r, vs := saltVerdicts(t, args...)
				wantSalt(t, r, vs, "e0", c.verdict, "")
				if v := vs["e0"]; v.Via != "gateway" || v.Salts != "tenants" {
					t.Fatalf("%+v", v)
				}
			}
			r, vs := saltVerdicts(t, "--target", gw.URL, "--api-key", "k1")
			if len(vs) != 1 || r.report.Salts[0].Verdict != audit.SaltUnknown || !strings.Contains(r.report.Salts[0].Detail, "--second-key") {
				t.Fatalf("without --second-key: %v", r)
			}
		})
	}
}

// Two backends behind the gateway, one broken: with no pin that the gateway confirms, neither
// gets a verdict from replies that may be the other's (unknown, never isolated).
func TestAuditSaltThroughGatewayNeedsThePin(t *testing.T) {
	honest := procs.StartSim(t, "--quiet")
	broken := procs.StartSim(t, "--quiet", "--bug", "salt-ignored")
	gw := saltGateway(t, "honest", honest.URL, "broken", broken.URL)
	r, vs := saltVerdicts(t, "--target", gw.URL, "--api-key", "k1", "--second-key", "k2", "--admin-key", "adm")
	for _, b := range []string{"honest", "broken"} {
		if v := vs[b]; v.Verdict != audit.SaltUnknown || !strings.Contains(v.Detail, audit.HeaderPinBackend) {
			t.Fatalf("%s: %+v\n%v", b, v, r)
		}
	}
}
