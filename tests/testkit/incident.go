package testkit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
)

// IncidentScene is a gateway in monitor mode over a leaking prefill/decode pair of simulators
// (prefill pool 4,096 under a 16,384-token context: the pool alarm is on) after traffic of every
// kind the status page and the dashboards show: admitted requests and streams, one 429 (tenant
// r, rpm 1), would-be refusals passed by monitor mode, and one cross-tenant leak cut by the
// canary scanner, recorded as an incident, with both backends quarantined.
type IncidentScene struct {
	GW              *Gateway
	Prefill, Decode *procs.Sim
	AdminKey        string // the admin key itself
	Victims         string // tenants whose markers can leak: a..e
}

// StartIncidentScene builds the scene; everything stops at test cleanup.
func StartIncidentScene(t testing.TB) *IncidentScene {
	t.Helper()
	common := []string{"--context-length", "16384", "--bug", "admit-rejected", "--page-size", "16", "--seed", "3"}
	s := &IncidentScene{AdminKey: "admin-key", Victims: "abcde"}
	s.Prefill = procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "4096", "--bootstrap-port", "0"}, common...)...)
	s.Decode = procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "16384"}, common...)...)
	var b strings.Builder
	fmt.Fprintf(&b, "backends:\n  - {name: p0, url: %q, role: prefill}\n  - {name: d0, url: %q, role: decode}\n", s.Prefill.URL, s.Decode.URL)
	b.WriteString("tenants:\n")
	for _, n := range []string{"a", "b", "c", "d", "e", "z"} {
		fmt.Fprintf(&b, "  - {name: %s, key_sha256: %q, tpm: 1000000}\n", n, KeySHA256("sk-"+n))
	}
	fmt.Fprintf(&b, "  - {name: r, key_sha256: %q, rpm: 1}\n", KeySHA256("sk-r"))
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", KeySHA256(s.AdminKey))
	b.WriteString("policy: {mode: monitor}\ncapacity: {poll_interval: 200ms}\n")
	b.WriteString("canary: {enabled: true, secret: incident-scene-canary-secret-32-bytes, every_bytes: 48, quarantine_ttl: 10m}\n")
	s.GW = StartGateway(t, ParseConfig(t, b.String()))

	chat := func(key, body string) (int, string) {
		req, _ := http.NewRequest("POST", s.GW.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST /v1/chat/completions: %v", err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	small := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":2,"stream":true}`
	if code, body := chat("sk-r", small); code != 200 {
		t.Fatalf("tenant r's first request: %d %s", code, body)
	}
	if code, body := chat("sk-r", small); code != 429 {
		t.Fatalf("tenant r's second request in a minute (rpm 1): want 429, got %d %s", code, body)
	}
	for i, tenant := range []string{"a", "b", "c", "d", "e"} {
		var words strings.Builder
		for j := 0; j < 300+120*i; j++ {
			fmt.Fprintf(&words, "w%d ", j%997)
		}
		body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"system","content":"You are tenant %s's assistant."},{"role":"user","content":%q}],"max_tokens":4}`,
			tenant, words.String())
		if code, out := chat("sk-"+tenant, body); code != 200 {
			t.Fatalf("warm-up %s: %d %s", tenant, code, out)
		}
	}
	// z's prompt is past prefill's max_req_input_len (4,090) and under the context: monitor
	// mode forwards it, the engine serves it from other tenants' stale pages, the scanner cuts it.
	oversized := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":600,"stream":true}`, strings.Repeat("tell me more ", 1800))
	if code, out := chat("sk-z", oversized); code != 200 || !strings.Contains(out, "upstream_integrity") || strings.Contains(out, "KVG-") {
		t.Fatalf("the leaking stream: want 200 cut with upstream_integrity and no marker, got %d %.300s", code, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var list struct {
			Incidents []struct{ Kind string } `json:"incidents"`
		}
		req, _ := http.NewRequest("GET", s.GW.URL+"/admin/incidents", nil)
		req.Header.Set("Authorization", "Bearer "+s.AdminKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
		}
		if len(list.Incidents) > 0 && list.Incidents[0].Kind == "leak" {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leak incident recorded after 5s: %+v", list)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
