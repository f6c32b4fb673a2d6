package gateway_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/tests/markerhour"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/redistest"
	"github.com/kvgate/kvgate/tests/testkit"
)

var anyMarker = regexp.MustCompile(`KVG-[a-z2-7]{20}`)

func testRedisURL() string { return redistest.URL() }

func uniquePrefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "kvgate-test-" + t.Name() + "-" + hex.EncodeToString(b[:]) + ":"
}

// canaryYAML: tenants a..e and z (key "sk-<name>"), canaries on, shared Redis state under prefix.
func canaryYAML(prefix, mode string, backends ...[3]string) string {
	var b strings.Builder
	b.WriteString("backends:\n")
	for _, be := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: %s}\n", be[0], be[1], be[2])
	}
	b.WriteString("tenants:\n")
	for _, n := range []string{"a", "b", "c", "d", "e", "z"} {
		fmt.Fprintf(&b, "  - {name: %s, key_sha256: %q}\n", n, testkit.KeySHA256("sk-"+n))
	}
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	fmt.Fprintf(&b, "policy: {mode: %s}\n", mode)
	b.WriteString("capacity: {poll_interval: 200ms}\n")
	b.WriteString("canary: {enabled: true, secret: test-secret-of-at-least-32-bytes, every_bytes: 48, quarantine_ttl: 10m}\n")
	fmt.Fprintf(&b, "state: {redis_url: %q, key_prefix: %q}\n", testRedisURL(), prefix)
	return b.String()
}

// The scenario: a leaking PD pair behind a gateway in monitor mode (admission out of the
// way), tenants a–e warm it, tenant z sends a prompt in the dangerous window. z must receive no
// marker and no "KVG-", an error instead; a second replica sharing Redis sees the incident and
// will not route to the quarantined backends until an operator releases them.
func TestCanaryCutsALeakAndQuarantinesAcrossReplicas(t *testing.T) {
	common := []string{"--context-length", "16384", "--bug", "admit-rejected", "--page-size", "16", "--seed", "3"}
	prefill := procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "4096", "--bootstrap-port", "0"}, common...)...)
	decode := procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "16384"}, common...)...)
	prefix := uniquePrefix(t)
	yaml := canaryYAML(prefix, "monitor", [3]string{"p0", prefix2url(prefill), "prefill"}, [3]string{"d0", prefix2url(decode), "decode"})
	gw1 := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))

	for i, tenant := range []string{"a", "b", "c", "d", "e"} {
		body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"system","content":"You are tenant %s's assistant."},{"role":"user","content":%q}],"max_tokens":4}`,
			tenant, words(300+120*i))
		r := post(t, gw1.URL, "/v1/chat/completions", "sk-"+tenant, body)
		if r.status != 200 {
			t.Fatalf("warm-up %s: %d %s", tenant, r.status, r.body)
		}
		if bytes.Contains(r.body, []byte("KVG-")) {
			t.Fatalf("warm-up reply leaked its own marker: %s", r.body)
		}
	}
	// z's prompt: past prefill's max_req_input_len (4,090), under the context.
	oversized := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":600,"stream":true}`, strings.Repeat("tell me more ", 1800))
	r := post(t, gw1.URL, "/v1/chat/completions", "sk-z", oversized)
	if r.status != 200 || r.header.Get("X-Kvgate-Monitor") == "" {
		t.Fatalf("monitor mode should forward the oversized stream: %d %v %s", r.status, r.header, r.body)
	}
	if bytes.Contains(r.body, []byte("KVG-")) || anyMarker.Match(r.body) {
		t.Fatalf("z received marker bytes:\n%s", r.body)
	}
	events := dataLines(r.body)
	if len(events) < 2 || events[len(events)-1] != "[DONE]" || !strings.Contains(events[len(events)-2], `"upstream_integrity"`) {
		t.Fatalf("want an upstream_integrity error event then [DONE], got %d events, last: %q", len(events), events[max(0, len(events)-2):])
	}

	// A second replica sharing the Redis.
	gw2 := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	var incidents struct {
		Incidents []struct {
			Kind, Victim, Requester string
			RequestID               string `json:"request_id"`
			Backends                []string
			Context                 string
		} `json:"incidents"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		a := get(t, gw2.URL+"/admin/incidents", "admin-key")
		if a.status == 200 && json.Unmarshal(a.body, &incidents) == nil && len(incidents.Incidents) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no incident visible from the second replica: %d %s", a.status, a.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	inc := incidents.Incidents[0]
	if inc.Kind != "leak" || inc.Requester != "z" || !strings.Contains("abcde", inc.Victim) || inc.Victim == "" ||
		len(inc.Backends) != 2 || strings.Contains(inc.Context, "KVG-") || inc.RequestID != r.header.Get("X-Request-Id") {
		t.Fatalf("incident wrong: %+v", inc)
	}
	t.Logf("incident: victim %s, backends %v, context %q", inc.Victim, inc.Backends, inc.Context)

	// gw2 must refuse to route to the quarantined pair (within one poll interval).
	small := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`
	waitStatus := func(url string, want int) reply {
		deadline := time.Now().Add(3 * time.Second)
		for {
			r := post(t, url, "/v1/chat/completions", "sk-a", small)
			if r.status == want {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("want %d from %s, got %d %s", want, url, r.status, r.body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if e := decodeError(t, waitStatus(gw2.URL, 503)); e.Error.Code != "no_backend" {
		t.Fatalf("quarantined: want no_backend, got %+v", e)
	}
	waitStatus(gw1.URL, 503)
	for _, name := range []string{"p0", "d0"} {
		if a := post(t, gw2.URL, "/admin/backends/"+name+"/release", "admin-key", ""); a.status != 200 {
			t.Fatalf("release %s: %d %s", name, a.status, a.body)
		}
	}
	waitStatus(gw2.URL, 200)
	waitStatus(gw1.URL, 200) // the release reached the other replica through Redis

	// The same prompt without streaming: the reply is refused whole with a 502.
	nonStream := strings.Replace(oversized, `"stream":true`, `"stream":false`, 1)
	r = post(t, gw2.URL, "/v1/chat/completions", "sk-z", nonStream)
	if r.status != 502 || decodeError(t, r).Error.Code != "upstream_integrity" || bytes.Contains(r.body, []byte("KVG-")) {
		t.Fatalf("non-streaming leak: want 502 upstream_integrity, got %d %s", r.status, r.body)
	}
	if msg := decodeError(t, r).Error.Message; !strings.Contains(msg, "quarantined") || strings.Contains(msg, "retry") {
		t.Fatalf("a leak's error must say the path is quarantined, not invite a retry: %q", msg)
	}
}

func prefix2url(s *procs.Sim) string { return s.URL }

// Tenant b pasting tenant a's (leaked) marker into its own prompt gets an echo: the marker is
// stripped from the reply, the echo recorded, and nothing is quarantined.
func TestForgedMarkerIsAnEchoNotAQuarantine(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "16384")
	prefix := uniquePrefix(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, canaryYAML(prefix, "enforce", [3]string{"sim", sim.URL, "unified"})))
	// Learn a's current marker the way an attacker might: from a's own prompt as the engine saw
	// it (the simulator's /generate echoes prompt text in its reply's quotes; here we derive it
	// from the keyring's public rule with the test secret).
	aMarker := markerFor(t, "test-secret-of-at-least-32-bytes", "a")
	// The simulator quotes the prompt: a prompt made mostly of a's marker makes the reply carry it.
	prompt := strings.Repeat(aMarker+" ", 200)
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":64,"stream":%v}`, prompt, stream)
		r := post(t, gw.URL, "/v1/chat/completions", "sk-b", body)
		if r.status != 200 {
			t.Fatalf("stream=%v: an echo must not fail the request: %d %s", stream, r.status, r.body)
		}
		if bytes.Contains(r.body, []byte("KVG-")) {
			t.Fatalf("stream=%v: marker not stripped: %s", stream, r.body)
		}
	}
	a := get(t, gw.URL+"/admin/incidents", "admin-key")
	var incidents struct {
		Incidents []struct{ Kind, Victim, Requester string } `json:"incidents"`
	}
	deadline := time.Now().Add(3 * time.Second)
	for len(incidents.Incidents) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		a = get(t, gw.URL+"/admin/incidents", "admin-key")
		_ = json.Unmarshal(a.body, &incidents)
	}
	if len(incidents.Incidents) == 0 {
		t.Fatalf("no echo recorded: %s", a.body)
	}
	for _, inc := range incidents.Incidents {
		if inc.Kind != "echo" || inc.Victim != "a" || inc.Requester != "b" {
			t.Fatalf("want only echoes of a's marker by b: %+v", incidents.Incidents)
		}
	}
	adm := get(t, gw.URL+"/admin/backends", "admin-key")
	if bytes.Contains(adm.body, []byte("quarantined_until")) {
		t.Fatalf("an echo must not quarantine: %s", adm.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-b", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); r.status != 200 {
		t.Fatalf("backend should still serve: %d %s", r.status, r.body)
	}
}

// Whatever the hour, every generation route hands the engine a marked prompt: the requester's
// marker of that hour at the end of the system text (chat, Responses, Messages) or before the
// prompt (completions, /generate), and, with every_bytes, repeated through the text of chat,
// completions and /generate, no stretch of it longer than every_bytes and a word. The marker is
// the one input to injection that changes by the hour; this sweeps 48 of them, whole and
// streamed (issue 37 asked whether some hour lets a marked prompt reach an engine unmarked).
func TestPromptsReachTheEngineMarkedAtEveryHour(t *testing.T) {
	const secret, every = "marked-prompts-secret-of-32-bytes", 48
	sim, err := enginesim.New(enginesim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]byte{} // the last body the engine received on each route
	handler := sim.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(ctx *fasthttp.RequestCtx) {
		if ctx.IsPost() {
			mu.Lock()
			got[string(ctx.Path())] = append([]byte(nil), ctx.PostBody()...)
			mu.Unlock()
		}
		handler(ctx)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })

	prose := tenantProse(37, 120) // about 650 bytes: a dozen repetitions
	p, _ := json.Marshal(prose)
	bodies := []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"system","content":"You answer."},{"role":"user","content":%s}],"max_tokens":4,"stream":%v}`},
		{"chat parts, no system", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":[{"type":"text","text":%s}]}],"max_tokens":4,"stream":%v}`},
		{"completions", "/v1/completions", `{"model":"sim","prompt":%s,"max_tokens":4,"stream":%v}`},
		{"generate", "/generate", `{"text":%s,"sampling_params":{"max_new_tokens":4},"stream":%v}`},
		{"responses", "/v1/responses", `{"model":"sim","instructions":"You answer.","input":%s,"max_output_tokens":4,"stream":%v}`},
		{"messages", "/v1/messages", `{"model":"sim","system":"You answer.","messages":[{"role":"user","content":%s}],"max_tokens":4,"stream":%v}`},
	}
	for h := 0; h < 48; h++ {
		at := time.Date(2026, 12, 4, h, 0, 0, 0, time.UTC)
		cfg := testkit.ParseConfig(t, fmt.Sprintf(`backends: [{name: eng, url: "http://%s", role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 1h}
canary: {enabled: true, secret: %s, every_bytes: %d}
`, ln.Addr(), testkit.KeySHA256(tenantKey), secret, every))
		cfg.Canary.Epoch = markerhour.EpochLenAt(at)
		gw := testkit.StartGateway(t, cfg)
		marker := markerhour.MarkerAt(secret, "alice", at)
		for _, b := range bodies {
			for _, stream := range []bool{false, true} {
				if r := post(t, gw.URL, b.path, tenantKey, fmt.Sprintf(b.body, p, stream)); r.status != 200 {
					t.Fatalf("%s, %s stream=%v: %d %s", at.Format("Jan 2 15:04"), b.name, stream, r.status, r.body)
				}
				mu.Lock()
				sent := string(got[b.path])
				mu.Unlock()
				// Markers and this prose need no JSON escaping: the raw body shows them as sent.
				if !strings.Contains(sent, marker) {
					t.Fatalf("%s, %s stream=%v: the engine got no marker of alice's: %s", at.Format("Jan 2 15:04"), b.name, stream, sent)
				}
				if strings.Count(sent, canary.MarkerPrefix) != strings.Count(sent, marker) {
					t.Fatalf("%s, %s: a marker not alice's of this hour: %s", at.Format("Jan 2 15:04"), b.name, sent)
				}
				if b.name == "responses" || b.name == "messages" {
					continue // the system text's marker only: every_bytes does not reach their turns
				}
				// The JSON string that holds the prose (it has no quote of its own).
				k := strings.Index(sent, prose[:40])
				if k < 0 {
					t.Fatalf("%s, %s: the prose's start is not in %s", at.Format("Jan 2 15:04"), b.name, sent)
				}
				text := sent[strings.LastIndexByte(sent[:k], '"')+1:]
				text = text[:strings.IndexByte(text, '"')]
				pieces := strings.Split(text, marker)
				if len(pieces) < len(prose)/every {
					t.Fatalf("%s, %s: %d markers in the prompt text, want about one per %d bytes: %q", at.Format("Jan 2 15:04"), b.name, len(pieces)-1, every, text)
				}
				for _, piece := range pieces {
					if len(piece) > every+16 { // a stretch ends at the first space after every bytes
						t.Fatalf("%s, %s: %d bytes of prompt without a marker: %q", at.Format("Jan 2 15:04"), b.name, len(piece), piece)
					}
				}
			}
		}
	}
}
