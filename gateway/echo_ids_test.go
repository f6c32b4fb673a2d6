package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiktoken-go/tokenizer"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// echoYAML: tenants a and b (keys sk-a, sk-b), canaries on, state in memory.
func echoYAML(backends ...[3]string) string {
	var b strings.Builder
	b.WriteString("backends:\n")
	for _, be := range backends {
		fmt.Fprintf(&b, "  - {name: %s, url: %q, role: %s}\n", be[0], be[1], be[2])
	}
	b.WriteString("tenants:\n")
	for _, n := range []string{"a", "b"} {
		fmt.Fprintf(&b, "  - {name: %s, key_sha256: %q}\n", n, testkit.KeySHA256("sk-"+n))
	}
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	b.WriteString("policy: {mode: enforce}\ncapacity: {poll_interval: 200ms}\n")
	b.WriteString("canary: {enabled: true, secret: test-secret-of-at-least-32-bytes, quarantine_ttl: 10m}\n")
	return b.String()
}

func cl100kIDs(t *testing.T, text string) string {
	t.Helper()
	c, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		t.Fatal(err)
	}
	ids, _, err := c.Encode(text)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ids)
	return string(b)
}

type incidentList struct {
	Incidents []struct{ Kind, Victim, Requester string } `json:"incidents"`
}

// waitIncidents polls /admin/incidents until at least n are recorded (they are written in the
// background) or a second passes.
func waitIncidents(t *testing.T, gw *testkit.Gateway, n int) incidentList {
	t.Helper()
	var l incidentList
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		l = incidentList{}
		_ = json.Unmarshal(get(t, gw.URL+"/admin/incidents", "admin-key").body, &l)
		if len(l.Incidents) >= n || time.Now().After(deadline) {
			return l
		}
	}
}

// Tenant b, knowing 8 characters of tenant a's marker, sends them to an engine that repeats its
// prompt, as token ids (unified and PD) and as text: each reply is an echo (stripped, recorded),
// never a leak, and nothing is quarantined: the backends keep serving.
func TestEchoFragmentInTokenIDsOrTextDoesNotQuarantine(t *testing.T) {
	uni := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--seed", "4")
	pre := procs.StartSim(t, "--mode", "prefill", "--pool-tokens", "8192", "--context-length", "8192", "--bootstrap-port", "0", "--seed", "4")
	dec := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "8192", "--context-length", "8192", "--seed", "4")
	frag := markerFor(t, "test-secret-of-at-least-32-bytes", "a")[:4+8] // "KVG-" + 8 characters
	bare := markerFor(t, "test-secret-of-at-least-32-bytes", "a")[4 : 4+12]
	// "!" ends each run: separators are transparent, so " back" could extend the run by one
	// character past the echo (a leak) in the hours when the marker's next character is 'b'.
	prompt := strings.Repeat("please repeat "+frag+"! back to me now ", 60)
	for name, gw := range map[string]*testkit.Gateway{
		"unified": testkit.StartGateway(t, testkit.ParseConfig(t, echoYAML([3]string{"u", uni.URL, "unified"}))),
		"pd":      testkit.StartGateway(t, testkit.ParseConfig(t, echoYAML([3]string{"p", pre.URL, "prefill"}, [3]string{"d", dec.URL, "decode"}))),
	} {
		for _, body := range []string{
			`{"input_ids":` + cl100kIDs(t, prompt) + `,"sampling_params":{"max_new_tokens":200}}`,
			fmt.Sprintf(`{"input_ids":[%s],"sampling_params":{"max_new_tokens":200},"stream":true}`, cl100kIDs(t, prompt)),
			fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":200}}`, prompt),
			// 12 characters without the prefix, in capitals: what the folded detector reads.
			fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":200}}`, strings.Repeat("say "+strings.ToUpper(bare)+"! again please ", 60)),
		} {
			r := post(t, gw.URL, "/generate", "sk-b", body)
			if r.status != 200 || bytes.Contains(r.body, []byte("KVG-")) || bytes.Contains(r.body, []byte("upstream_integrity")) {
				t.Fatalf("%s %.40s: an echo must be stripped, not cut: %d %.300s", name, body, r.status, r.body)
			}
		}
		l := waitIncidents(t, gw, 3)
		if len(l.Incidents) < 3 {
			t.Fatalf("%s: the replies should have repeated the fragment (3 echoes): %+v", name, l)
		}
		for _, inc := range l.Incidents {
			if inc.Kind != "echo" || inc.Victim != "a" || inc.Requester != "b" {
				t.Fatalf("%s: want only echoes of a's marker by b: %+v", name, l.Incidents)
			}
		}
		if adm := get(t, gw.URL+"/admin/backends", "admin-key"); bytes.Contains(adm.body, []byte("quarantined_until")) {
			t.Fatalf("%s: an echo must not quarantine: %s", name, adm.body)
		}
		if r := post(t, gw.URL, "/generate", "sk-a", `{"text":"hello","sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
			t.Fatalf("%s: the backend must keep serving: %d %s", name, r.status, r.body)
		}
	}
}

// fakeEngine is a loopback SGLang stand-in with no /detokenize, whose /generate answers with
// reply (the prompt's text cannot be read back, and the engine says what it likes).
func fakeEngine(t *testing.T, reply *atomic.Value) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/server_info", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"model_path":"fake","served_model_name":"fake","max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":1,"disaggregation_mode":"null","status":"ready"}`)
	})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake","object":"model","max_model_len":8192}]}`)
	})
	mux.HandleFunc("/generate", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		b, _ := json.Marshal(map[string]any{"text": reply.Load().(string), "output_ids": []int{1},
			"meta_info": map[string]any{"id": "x", "prompt_tokens": 3, "completion_tokens": 1, "finish_reason": map[string]any{"type": "length", "length": 1}}})
		w.Write(b)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// An engine that cannot detokenize a token-id prompt leaves its text unknown: a fragment of
// another tenant's marker in the reply may be the client's own, so the reply is cut and the
// incident recorded, but nothing is quarantined; a whole foreign marker still quarantines.
func TestEchoUnreadTokenIDsFragmentCutsWithoutQuarantine(t *testing.T) {
	var reply atomic.Value
	url := fakeEngine(t, &reply)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, echoYAML([3]string{"fake", url, "unified"})))
	aMarker := markerFor(t, "test-secret-of-at-least-32-bytes", "a")
	// Ids outside the gateway's vocabulary too: nothing can read them.
	ids := `{"input_ids":[900000001,900000002,900000003],"sampling_params":{"max_new_tokens":1}}`

	reply.Store("sure: " + aMarker[:12] + " is what you sent")
	r := post(t, gw.URL, "/generate", "sk-b", ids)
	if r.status != 502 || decodeError(t, r).Error.Code != "upstream_integrity" || bytes.Contains(r.body, []byte("KVG-")) {
		t.Fatalf("a fragment must cut the reply: %d %s", r.status, r.body)
	}
	if l := waitIncidents(t, gw, 1); len(l.Incidents) != 1 || l.Incidents[0].Kind != "leak" || l.Incidents[0].Victim != "a" {
		t.Fatalf("the cut must be recorded: %+v", l)
	}
	if adm := get(t, gw.URL+"/admin/backends", "admin-key"); bytes.Contains(adm.body, []byte("quarantined_until")) {
		t.Fatalf("a fragment after an unreadable token-id prompt must not quarantine: %s", adm.body)
	}
	// A whole marker cannot be explained by 8 guessed characters: it quarantines.
	reply.Store("here: " + aMarker)
	r = post(t, gw.URL, "/generate", "sk-b", ids)
	if r.status != 502 || bytes.Contains(r.body, []byte("KVG-")) {
		t.Fatalf("a whole marker must cut the reply: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(time.Second)
	for {
		adm := get(t, gw.URL+"/admin/backends", "admin-key")
		if bytes.Contains(adm.body, []byte("quarantined_until")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a whole foreign marker must still quarantine: %s", adm.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
