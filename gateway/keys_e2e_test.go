package gateway_test

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Through a real gateway to a real simulator: bodies whose keys a Python engine reads
// differently from the gateway are refused with an OpenAI-style 400 naming the field path, and
// the engine never sees them; the same body with exact keys is served.
func TestKeysRefusedBeforeTheEngine(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	long := strings.Repeat("lorem ", 6000)
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `","TEXT":"hi"}]}],"max_tokens":1}`, "messages[0].content[0].TEXT"},
		{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1,"MAX_NEW_TOKENS":8000}}`, "sampling_params.MAX_NEW_TOKENS"},
		{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1,"max_new_tokens":8000}}`, "sampling_params.max_new_tokens"},
		{"/generate", `{"text":"hi","sampling_params":{"MAX_NEW_TOKENS":8000}}`, "sampling_params.MAX_NEW_TOKENS"},
		{"/generate", `{"text":"hi","sampling_params":{"custom_params":{"x":1}}}`, "sampling_params.custom_params"},
		{"/v1/completions", `{"prompt":"hi","max_tokens":1,"Max_Tokens":8000}`, "Max_Tokens"},
	} {
		r := post(t, gw.URL, c.path, tenantKey, c.body)
		e := decodeError(t, r)
		if r.status != 400 || e.Error.Code != "invalid_request" || e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s %.60s: %d %s, want 400 naming %s", c.path, c.body, r.status, r.body, c.param)
		}
	}
	st := sim.Stats(t)
	for route, n := range st.Requests {
		if n != 0 {
			t.Fatalf("the engine saw %d request(s) on %s: %+v", n, route, st)
		}
	}
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi","sampling_params":{"max_new_tokens":2,"temperature":0}}`); r.status != 200 {
		t.Fatalf("exact keys must be served: %d %s", r.status, r.body)
	}
}
