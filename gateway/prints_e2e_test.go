package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/redistest"
	"github.com/kvgate/kvgate/tests/testkit"
)

// These tests are issue 18's "done when": the leaking simulator pair behind kvgate with the
// default canary settings (canary.enabled and a secret, nothing else), in monitor mode so that
// admission lets the oversized prompt through.

// tenantProse is text of n made-up words, different for every seed (a tenant's own prompt text).
func tenantProse(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	syll := []string{"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "dro", "fen", "gil", "hor", "bel", "tas"}
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		for j := 0; j < 1+rng.IntN(3); j++ {
			b.WriteString(syll[rng.IntN(len(syll))])
		}
		if rng.IntN(12) == 0 {
			b.WriteByte('.')
		}
	}
	return b.String()
}

// printsYAML: tenants t0…t(n−1) and z (key "sk-<name>"), the default canary settings, shared
// Redis state under prefix.
func printsYAML(prefix, mode string, tenants int, extra string, backends ...[3]string) string {
	var b strings.Builder
	b.WriteString("backends:\n")
	for _, be := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: %s}\n", be[0], be[1], be[2])
	}
	b.WriteString("tenants:\n")
	for i := 0; i < tenants; i++ {
		fmt.Fprintf(&b, "  - {name: t%d, key_sha256: %q}\n", i, testkit.KeySHA256(fmt.Sprintf("sk-t%d", i)))
	}
	fmt.Fprintf(&b, "  - {name: z, key_sha256: %q}\n", testkit.KeySHA256("sk-z"))
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	fmt.Fprintf(&b, "policy: {mode: %s}\n", mode)
	b.WriteString("capacity: {poll_interval: 200ms}\n")
	b.WriteString("canary: {enabled: true, secret: test-secret-of-at-least-32-bytes" + extra + "}\n")
	fmt.Fprintf(&b, "state: {redis_url: %q, key_prefix: %q}\n", testRedisURL(), prefix)
	return b.String()
}

// genBody is a request body of route kind for prompt, asking for maxOut tokens.
func genBody(path, prompt string, maxOut int, stream bool) string {
	p, _ := json.Marshal(prompt)
	switch path {
	case "/v1/completions":
		return fmt.Sprintf(`{"model":"sim","prompt":%s,"max_tokens":%d,"stream":%v}`, p, maxOut, stream)
	case "/generate":
		return fmt.Sprintf(`{"text":%s,"sampling_params":{"max_new_tokens":%d},"stream":%v}`, p, maxOut, stream)
	case "/v1/responses":
		return fmt.Sprintf(`{"model":"sim","input":%s,"max_output_tokens":%d,"stream":%v}`, p, maxOut, stream)
	}
	// chat and messages
	return fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%s}],"max_tokens":%d,"stream":%v}`, p, maxOut, stream)
}

// replyText is the generated text a client got: the text deltas of a stream (for /generate,
// whose events repeat the text so far, the longest), or a whole reply's text fields; and whether
// the reply was refused or cut as upstream_integrity.
func replyText(r reply, path string) (text string, integrity bool) {
	var parts []string
	var longest string
	collect := func(v any) {
		var walk func(v any, key string)
		walk = func(v any, key string) {
			switch t := v.(type) {
			case map[string]any:
				if t["type"] == "error" && t["code"] == "upstream_integrity" { // a Responses error event
					integrity = true
					return
				}
				if e, ok := t["error"].(map[string]any); ok {
					// OpenAI's envelope names the code; Anthropic's only says it in the message.
					integrity = integrity || e["code"] == "upstream_integrity" ||
						strings.Contains(fmt.Sprint(e["message"]), "another tenant's data")
					return
				}
				for k, e := range t {
					walk(e, k)
				}
			case []any:
				for _, e := range t {
					walk(e, key)
				}
			case string:
				switch key {
				case "content", "text", "delta", "reasoning_content":
					parts = append(parts, t)
					if len(t) > len(longest) {
						longest = t
					}
				}
			}
		}
		walk(v, "")
	}
	if strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		for _, d := range dataLines(r.body) {
			var v any
			if json.Unmarshal([]byte(d), &v) == nil {
				collect(v)
			}
		}
	} else {
		var v any
		if json.Unmarshal(r.body, &v) == nil {
			collect(v)
		}
	}
	if path == "/generate" && strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		return longest, integrity // each event repeats the text so far
	}
	return strings.Join(parts, ""), integrity
}

type incidentRecord struct {
	Kind, Victim, Requester, Detector, Context string
	Evidence                                   string
	Flagged, Quarantined                       bool
	RequestID                                  string `json:"request_id"`
	Matches, Victims                           int
	Fingerprints                               []struct {
		Fingerprint string
		End, Length int
		Victim      string
	}
}

func listIncidents(t *testing.T, url string) []incidentRecord {
	t.Helper()
	var out struct {
		Incidents []incidentRecord `json:"incidents"`
	}
	a := get(t, url+"/admin/incidents?limit=1000", "admin-key")
	if a.status != 200 || json.Unmarshal(a.body, &out) != nil {
		t.Fatalf("incidents: %d %s", a.status, a.body)
	}
	return out.Incidents
}

// waitIncident waits for the incident of request id (they are written in the background).
func waitIncident(t *testing.T, url, rid string) (incidentRecord, bool) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		for _, inc := range listIncidents(t, url) {
			if inc.RequestID == rid {
				return inc, true
			}
		}
		if time.Now().After(deadline) {
			return incidentRecord{}, false
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// releaseAfter settles the incident inc of a leak: a marker's quarantine is released
// (releaseAll); a prompt-text match alone (issue 31: evidence "text") quarantined nothing, and
// every gateway goes on routing to the pair.
func releaseAfter(t *testing.T, gws []*testkit.Gateway, prefix string, inc incidentRecord) {
	t.Helper()
	if inc.Evidence != "text" {
		releaseAll(t, gws, prefix)
		return
	}
	if inc.Quarantined {
		t.Fatalf("a text match alone quarantined: %+v", inc)
	}
	c := redistest.Client(t)
	keys := state.Keys{Prefix: prefix}
	if n := c.Exists(context.Background(), keys.QuarantineFlag("p0"), keys.QuarantineFlag("d0")).Val(); n != 0 {
		t.Fatalf("a text match alone quarantined %d backends: %+v", n, inc)
	}
	small := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":1}`
	for _, gw := range gws {
		if r := post(t, gw.URL, "/v1/chat/completions", "sk-t0", small); r.status != 200 {
			t.Fatalf("%s refuses a bystander after a text match alone: %d %s", gw.URL, r.status, r.body)
		}
	}
}

// releaseAll ends the quarantine of the pair and waits until every gateway routes again.
func releaseAll(t *testing.T, gws []*testkit.Gateway, prefix string) {
	t.Helper()
	// The quarantine reaches Redis in the background after the incident: release only once it is
	// there, or the late write would quarantine the pair again.
	c := redistest.Client(t)
	keys := state.Keys{Prefix: prefix}
	deadline := time.Now().Add(5 * time.Second)
	for c.Exists(context.Background(), keys.QuarantineFlag("p0"), keys.QuarantineFlag("d0")).Val() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the quarantine never reached Redis")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, name := range []string{"p0", "d0"} {
		if a := post(t, gws[0].URL, "/admin/backends/"+name+"/release", "admin-key", ""); a.status != 200 {
			t.Fatalf("release %s: %d %s", name, a.status, a.body)
		}
	}
	small := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":1}`
	for _, gw := range gws {
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := post(t, gw.URL, "/v1/chat/completions", "sk-z", small)
			if r.status == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still refuses after the release: %d %s", gw.URL, r.status, r.body)
			}
			time.Sleep(30 * time.Millisecond)
		}
	}
}

// leakPair starts the leaking prefill/decode pair: prefill's max_req_input_len is about 4,090
// tokens, the context 16,384, and the decode pool reads the stale pages of earlier prompts.
func leakPair(t *testing.T, seed string) (prefill, decode *procs.Sim) {
	common := []string{"--context-length", "16384", "--bug", "admit-rejected", "--page-size", "16", "--seed", seed}
	prefill = procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "4096", "--bootstrap-port", "0"}, common...)...)
	decode = procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "16384"}, common...)...)
	return prefill, decode
}

// leakTrial: warm tenants (prompts through gws in turn) write their pages; z's oversized prompt
// then reads them. It returns z's reply, whether the decode engine says it read foreign pages,
// and the text that reached z.
func leakTrial(t *testing.T, gws []*testkit.Gateway, zgw *testkit.Gateway, decode *procs.Sim, trial int, path string, stream bool) (r reply, leaked bool, text string, integrity bool) {
	t.Helper()
	return leakTrialOf(t, gws, zgw, decode, trial, path, stream, strings.Repeat("tell me more ", 1800))
}

// leakTrialOf is leakTrial with z's prompt: it must be over the prefill's max_req_input_len
// (about 4,090 tokens) and, with its markers and 600 tokens of output, within the context
// (16,384).
func leakTrialOf(t *testing.T, gws []*testkit.Gateway, zgw *testkit.Gateway, decode *procs.Sim, trial int, path string, stream bool, zPrompt string) (r reply, leaked bool, text string, integrity bool) {
	t.Helper()
	for i := 0; i < 6; i++ {
		tenant := fmt.Sprintf("t%d", (trial*6+i)%40)
		body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"system","content":"You answer questions about documents."},{"role":"user","content":%q}],"max_tokens":2}`,
			tenantProse(uint64(trial*100+i), 350))
		if w := post(t, gws[(trial*6+i)%len(gws)].URL, "/v1/chat/completions", "sk-"+tenant, body); w.status != 200 {
			t.Fatalf("warm-up %s: %d %s", tenant, w.status, w.body)
		}
	}
	before := decode.Stats(t).ForeignReplies
	r = post(t, zgw.URL, path, "sk-z", genBody(path, zPrompt, 600, stream))
	leaked = decode.Stats(t).ForeignReplies > before
	text, integrity = replyText(r, path)
	return r, leaked, text, integrity
}

// Default settings, one gateway: every leaking reply, on every generation route, streaming and
// not, ends in a fingerprint incident (no victim text in it) and is cut after few foreign bytes.
func TestPromptTextLeakIsCutWithDefaultSettings(t *testing.T) {
	prefill, decode := leakPair(t, "3")
	prefix := uniquePrefix(t)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, printsYAML(prefix, "monitor", 40, "",
		[3]string{"p0", prefill.URL, "prefill"}, [3]string{"d0", decode.URL, "decode"})))
	gws := []*testkit.Gateway{gw}
	paths := []string{"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses", "/v1/messages"}
	var leaks, streamedLeaks, streamedBytes int
	for trial := 0; trial < 2*len(paths); trial++ {
		path, stream := paths[trial%len(paths)], trial >= len(paths)
		r, leaked, text, integrity := leakTrial(t, gws, gw, decode, trial, path, stream)
		if !leaked {
			t.Logf("trial %d %s stream=%v: the engine read no foreign page (not a leaking reply)", trial, path, stream)
			continue
		}
		leaks++
		rid := r.header.Get("X-Request-Id")
		if !integrity {
			t.Fatalf("trial %d %s stream=%v: a leaking reply was not cut: %d, %d bytes of text reached the client", trial, path, stream, r.status, len(text))
		}
		inc, ok := waitIncident(t, gw.URL, rid)
		if !ok {
			t.Fatalf("trial %d %s stream=%v: no incident for request %s", trial, path, stream, rid)
		}
		if inc.Kind != "leak" || inc.Requester != "z" || !strings.HasPrefix(inc.Victim, "t") || inc.Context != "" {
			t.Fatalf("trial %d: incident %+v", trial, inc)
		}
		if inc.Detector == "fingerprint" {
			if inc.Matches < 3 || len(inc.Fingerprints) == 0 {
				t.Fatalf("trial %d: fingerprint incident without its evidence: %+v", trial, inc)
			}
			for _, m := range inc.Fingerprints {
				if len(m.Fingerprint) != 16 || m.Length <= 0 || m.End <= 0 || !strings.HasPrefix(m.Victim, "t") {
					t.Fatalf("trial %d: evidence %+v", trial, m)
				}
			}
		}
		if stream {
			streamedLeaks++
			streamedBytes += len(text)
		} else if r.status != 502 || text != "" {
			t.Fatalf("trial %d %s: a whole leaking reply must be a 502 with no text: %d %q", trial, path, r.status, text)
		}
		t.Logf("trial %d %s stream=%v: cut by %s after %d bytes of text, %d matches from %d tenants", trial, path, stream, inc.Detector, len(text), inc.Matches, inc.Victims)
		releaseAfter(t, gws, prefix, inc)
	}
	if leaks < 2*len(paths)-1 || streamedLeaks == 0 {
		t.Fatalf("only %d of %d trials leaked (%d streamed): the scenario does not reproduce the leak", leaks, 2*len(paths), streamedLeaks)
	}
	noVictimTextInRedis(t, prefix, 2*len(paths))
	avg := float64(streamedBytes) / float64(streamedLeaks)
	t.Logf("streamed leaks: %d, %.0f bytes of text reached the client on average before the cut", streamedLeaks, avg)
	if avg > 256 {
		t.Fatalf("on average %.0f bytes of another tenant's text reached the client before the cut, want ≤ 256", avg)
	}
}

// Four replicas taking turns, one Redis. With shared fingerprints (the default) at least 95% of
// leaking replies are caught. Replica-local fingerprints are measured too: in this scenario
// (the simulator's LIFO allocator, one warm-up at a time) a leaking reply quotes the last
// prompt's pages mostly, so a replica catches it mainly when it forwarded that prompt.
func TestPromptTextLeakAcrossFourReplicas(t *testing.T) {
	for _, mode := range []struct {
		name, extra string
		want        float64
	}{{"shared", "", 0.95}, {"replica_local", ", fingerprints: {replica_local: true}", 0}} {
		t.Run(mode.name, func(t *testing.T) {
			prefill, decode := leakPair(t, "5")
			prefix := uniquePrefix(t)
			yaml := printsYAML(prefix, "monitor", 40, mode.extra, [3]string{"p0", prefill.URL, "prefill"}, [3]string{"d0", decode.URL, "decode"})
			var gws []*testkit.Gateway
			for i := 0; i < 4; i++ {
				gws = append(gws, testkit.StartGateway(t, testkit.ParseConfig(t, yaml)))
			}
			// The rate is measured on a sample whose quotes move with the hour's markers: with
			// 20 trials, one pinned hour in 48 caught 18 (KVGATE_TEST_HOUR=27), though the 48
			// hours together caught 955 of 960 (issue 37). 40 keep one unlucky hour from failing.
			const trials = 40
			var leaks, caught, streamedBytes, streamed int
			for trial := 0; trial < trials; trial++ {
				zgw := gws[(trial*7+3)%4]
				stream := trial%2 == 0
				r, leaked, text, integrity := leakTrial(t, gws, zgw, decode, trial, "/v1/chat/completions", stream)
				if !leaked {
					continue
				}
				leaks++
				if !integrity {
					continue
				}
				caught++
				inc, ok := waitIncident(t, zgw.URL, r.header.Get("X-Request-Id"))
				if !ok {
					t.Fatalf("trial %d: cut without an incident", trial)
				}
				if stream {
					streamed++
					streamedBytes += len(text)
				}
				releaseAfter(t, gws, prefix, inc)
			}
			if leaks < trials-1 {
				t.Fatalf("only %d of %d trials leaked", leaks, trials)
			}
			rate := float64(caught) / float64(leaks)
			t.Logf("4 replicas, %s fingerprints: %d of %d leaking replies caught (%.0f%%); streamed: %.0f bytes of text before the cut on average",
				mode.name, caught, leaks, 100*rate, float64(streamedBytes)/float64(max(streamed, 1)))
			if rate < mode.want {
				t.Fatalf("4 replicas taking turns caught %d of %d leaking replies (%.0f%%), want ≥ %.0f%%", caught, leaks, 100*rate, 100*mode.want)
			}
		})
	}
}

// noVictimTextInRedis reads every key the gateway wrote under prefix: no 24-byte run of any
// warm-up prompt of trials [0, trials) is in any of them, and the incident and fingerprint
// streams expire.
func noVictimTextInRedis(t *testing.T, prefix string, trials int) {
	t.Helper()
	c := redistest.Client(t)
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys under %s: %v %v", prefix, keys, err)
	}
	var dump strings.Builder
	for _, k := range keys {
		switch typ := c.Type(ctx, k).Val(); typ {
		case "stream":
			msgs, _ := c.XRange(ctx, k, "-", "+").Result()
			for _, m := range msgs {
				fmt.Fprint(&dump, m.Values)
			}
			if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
				t.Errorf("stream %s never expires (PTTL %v)", k, ttl)
			}
		case "string":
			dump.WriteString(c.Get(ctx, k).Val())
		case "hash":
			fmt.Fprint(&dump, c.HGetAll(ctx, k).Val())
		case "set":
			fmt.Fprint(&dump, c.SMembers(ctx, k).Val())
		case "zset":
			fmt.Fprint(&dump, c.ZRange(ctx, k, 0, -1).Val())
		}
	}
	all := dump.String()
	if !strings.Contains(all, "incident") {
		t.Fatalf("no incident stream among %v", keys)
	}
	for trial := 0; trial < trials; trial++ {
		for i := 0; i < 6; i++ {
			p := tenantProse(uint64(trial*100+i), 350)
			for j := 0; j+24 <= len(p); j += 24 {
				if strings.Contains(all, p[j:j+24]) {
					t.Fatalf("Redis holds victim text %q (trial %d, warm-up %d)", p[j:j+24], trial, i)
				}
			}
		}
	}
}

// Context around a marker hit is kept only when asked for (canary.incident_context), redacted.
//
// The leak must quote a marker (fingerprints are off). The simulator quotes runs of at least 16
// tokens, from a word start to a word end, about 43 bytes of this prose; with every_bytes: 48
// the prose between two markers is about as long, so every quote could fall between markers,
// and did at some hours (issue 37: all five quotes at 18:00 UTC on 2026-12-04, from two warm-ups'
// marked prompts, read as 200 bytes of unmarked prose). With every_bytes: 16 the stretches are
// at most about 27 bytes, so a quote that starts after one marker runs into the next, whole
// (no word ends inside a marker); only the last stretch of a prompt with its template tokens
// could make a quote without one. z's prompt is shorter to fit its own markers in the context.
func TestIncidentContextOnlyWhenAsked(t *testing.T) {
	for _, optIn := range []bool{false, true} {
		prefill, decode := leakPair(t, "3")
		prefix := uniquePrefix(t)
		extra := ", every_bytes: 16, fingerprints: {off: true}"
		if optIn {
			extra += ", incident_context: true"
		}
		gw := testkit.StartGateway(t, testkit.ParseConfig(t, printsYAML(prefix, "monitor", 40, extra,
			[3]string{"p0", prefill.URL, "prefill"}, [3]string{"d0", decode.URL, "decode"})))
		r, leaked, _, integrity := leakTrialOf(t, []*testkit.Gateway{gw}, gw, decode, 0, "/v1/chat/completions", true, strings.Repeat("tell me more ", 700))
		if !leaked || !integrity {
			t.Fatalf("incident_context=%v: the marker leak was not reproduced and cut (leaked %v, cut %v)", optIn, leaked, integrity)
		}
		inc, ok := waitIncident(t, gw.URL, r.header.Get("X-Request-Id"))
		if !ok || inc.Detector != "marker" {
			t.Fatalf("incident_context=%v: want a marker incident, got %+v (found %v)", optIn, inc, ok)
		}
		if optIn != (inc.Context != "") || strings.Contains(inc.Context, "KVG-") || len(inc.Context) > 220 {
			t.Fatalf("incident_context=%v: context %q", optIn, inc.Context)
		}
	}
}
