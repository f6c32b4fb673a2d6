package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// The output the admission rule reserves is multiplied by every count of generated sequences:
// chat and completions n, completions best_of, /generate sampling_params.n. With a 4,096-token
// context, 1,500 output tokens fit once but not three times.
func TestOutputTimesNInTheCheck(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "16384", "--context-length", "4096")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	for _, c := range []struct {
		path, body string
		want       int
	}{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1500,"n":1}`, 200},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1500,"n":3}`, 413},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1500,"n":3}`, 413},
		{"/v1/completions", `{"prompt":"hi","max_tokens":1500}`, 200},
		{"/v1/completions", `{"prompt":"hi","max_tokens":1500,"n":3}`, 413},
		{"/v1/completions", `{"prompt":"hi","max_tokens":1500,"best_of":3}`, 413},
		{"/v1/completions", `{"prompt":"hi","max_tokens":1500,"n":1,"best_of":3}`, 413},
		{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1500}}`, 200},
		{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1500,"n":3}}`, 413},
	} {
		r := post(t, gw.URL, c.path, tenantKey, c.body)
		if r.status != c.want {
			t.Errorf("%s %s: %d %s, want %d", c.path, c.body, r.status, r.body, c.want)
			continue
		}
		if c.want == 413 && decodeError(t, r).Error.Code != "context_length_exceeded" {
			t.Errorf("%s %s: %s", c.path, c.body, r.body)
		}
	}
	st := sim.Stats(t)
	if n := st.Requests["/generate"] + st.Requests["/v1/completions"] + st.Requests["/v1/chat/completions"]; n != 3 {
		t.Fatalf("the engine should have seen only the 3 admitted requests: %+v", st.Requests)
	}
}

// The README's promise: engines never see the client's X-Request-Id (the rid and the header they
// get are the gateway's own), on a unified backend and on both legs of a PD pair; the client
// still gets its own id back.
func TestEngineNeverSeesClientRequestID(t *testing.T) {
	uni := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	pre := procs.StartSim(t, "--mode", "prefill", "--pool-tokens", "8192", "--context-length", "8192", "--bootstrap-port", "0")
	dec := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "8192", "--context-length", "8192")
	gwU := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"u", uni.URL, "unified"})))
	gwPD := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"p", pre.URL, "prefill"}, [3]string{"d", dec.URL, "decode"})))
	const clientID = "client-chosen-id-4417"
	for _, gw := range []*testkit.Gateway{gwU, gwPD} {
		for _, c := range []struct{ path, body string }{
			{"/generate", `{"text":"hello there","sampling_params":{"max_new_tokens":3}}`},
			{"/v1/completions", `{"prompt":"hello there","max_tokens":3,"stream":true}`},
			{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"max_tokens":3}`},
		} {
			req, _ := http.NewRequest("POST", gw.URL+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer "+tenantKey)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Request-Id", clientID)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != clientID {
				t.Fatalf("%s: %d X-Request-Id=%q %s", c.path, resp.StatusCode, resp.Header.Get("X-Request-Id"), b)
			}
		}
	}
	for name, s := range map[string]*procs.Sim{"unified": uni, "prefill": pre, "decode": dec} {
		ids := s.Stats(t).RequestIDs
		if len(ids) != 3 {
			t.Fatalf("%s: want 3 generation requests recorded, got %q", name, ids)
		}
		for _, id := range ids {
			if id == clientID || !strings.HasPrefix(id, "kvg-") {
				t.Fatalf("%s saw X-Request-Id %q: want the gateway's own engine id", name, id)
			}
		}
	}
}
