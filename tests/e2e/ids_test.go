package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

const aliceKey = "sk-e2e-alice"

func gatewayYAML(url, extra string) string {
	return backendsYAML(fmt.Sprintf(`[{name: eng, url: %q, role: unified}]`, url), extra)
}

// backendsYAML is a gateway's configuration with the given backends list (YAML) and one tenant.
func backendsYAML(backends, extra string) string {
	return fmt.Sprintf(`backends: %s
tenants:
  - {name: alice, key_sha256: %q}
capacity: {poll_interval: 200ms}
%s`, backends, testkit.KeySHA256(aliceKey), extra)
}

// post sends body to path with the tenant's key and the extra headers; it returns the status,
// the reply's X-Request-Id and its body.
func post(t *testing.T, url, body string, headers map[string]string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Request-Id"), string(b)
}

// idRoutes are the generation routes, each with a small body.
var idRoutes = []struct{ path, body string }{
	{"/generate", `{"text":"hello there","sampling_params":{"max_new_tokens":2}}`},
	{"/v1/completions", `{"model":"sim","prompt":"hello there","max_tokens":2}`},
	{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":2}`},
	{"/v1/responses", `{"model":"sim","input":"hello there","max_output_tokens":2}`},
	{"/v1/messages", `{"model":"sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":2}`},
}

// TestClientIDsNeverReachTheEngine (issue 39): a client's X-Request-Id, reused (CVE-2026-105755)
// or one character long, and a client's body rid (a one-character rid: CVE-2026-112266) never
// reach an engine as given, on a unified engine or on either leg of a prefill + decode pair. The
// engines, which record what they received (/sim/stats), see the gateway's own id in both the
// header and the body, a fresh one per request; the client keeps seeing its own id in the reply;
// a body rid is refused with 400 naming it before any engine.
func TestClientIDsNeverReachTheEngine(t *testing.T) {
	t.Run("unified", func(t *testing.T) {
		sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
		checkClientIDs(t, gatewayYAML(sim.URL, ""), sim)
	})
	t.Run("pd", func(t *testing.T) {
		pre := procs.StartSim(t, "--mode", "prefill", "--pool-tokens", "8192", "--context-length", "8192", "--bootstrap-port", "0")
		dec := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "8192", "--context-length", "8192")
		checkClientIDs(t, backendsYAML(fmt.Sprintf(`[{name: p, url: %q, role: prefill}, {name: d, url: %q, role: decode}]`, pre.URL, dec.URL), ""), pre, dec)
	})
}

func checkClientIDs(t *testing.T, cfg string, sims ...*procs.Sim) {
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, cfg))
	seen := make([]map[string]bool, len(sims)) // per engine, the ids so far: each must be new
	for i := range seen {
		seen[i] = map[string]bool{}
	}
	for _, rt := range idRoutes {
		for _, clientID := range []string{"reused-id", "reused-id", "a"} {
			before := make([]int, len(sims))
			for i, sim := range sims {
				before[i] = len(sim.Stats(t).RequestIDs)
			}
			status, echoed, body := post(t, gw.URL+rt.path, rt.body, map[string]string{"X-Request-Id": clientID})
			if status != 200 {
				t.Fatalf("%s: %d %.300s", rt.path, status, body)
			}
			if echoed != clientID {
				t.Errorf("%s: the client sent X-Request-Id %q and got back %q", rt.path, clientID, echoed)
			}
			for i, sim := range sims {
				st := sim.Stats(t)
				if len(st.RequestIDs) != before[i]+1 || len(st.RIDs) != len(st.RequestIDs) {
					t.Fatalf("%s: engine %d recorded %d requests (%d rids), want %d", rt.path, i, len(st.RequestIDs), len(st.RIDs), before[i]+1)
				}
				hdr, rid := st.RequestIDs[before[i]], st.RIDs[before[i]]
				if hdr == clientID || !strings.HasPrefix(hdr, "kvg-") || seen[i][hdr] {
					t.Errorf("%s: engine %d saw X-Request-Id %q for the client's %q (want a fresh gateway id)", rt.path, i, hdr, clientID)
				}
				if want := fmt.Sprintf("%q", hdr); rid != want {
					t.Errorf("%s: engine %d saw rid %s, want the gateway's own %s", rt.path, i, rid, want)
				}
				seen[i][hdr] = true
			}
		}
	}
	// A body rid is refused whatever its length, before any engine is asked.
	before := make([]int, len(sims))
	for i, sim := range sims {
		before[i] = len(sim.Stats(t).RequestIDs)
	}
	for _, rt := range idRoutes {
		for _, rid := range []string{`"a"`, `"` + strings.Repeat("x", 40) + `"`, `["a"]`} {
			body := strings.TrimSuffix(rt.body, "}") + `,"rid":` + rid + `}`
			status, _, reply := post(t, gw.URL+rt.path, body, nil)
			if status != 400 || !strings.Contains(reply, `rid`) {
				t.Errorf("%s with rid %s: %d %.300s; want 400 naming rid", rt.path, rid, status, reply)
			}
		}
	}
	for i, sim := range sims {
		if after := len(sim.Stats(t).RequestIDs); after != before[i] {
			t.Errorf("requests with a client rid reached engine %d: %d → %d", i, before[i], after)
		}
	}
}
