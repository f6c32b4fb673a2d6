package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// TestTemplateKwargsRefused: chat_template_kwargs reaches the engine's apply_chat_template as
// keyword arguments, so a chat_template there replaces the model's template (a loop over the
// messages renders any prompt size from a short body) and other keys change the render. Every key
// but the template switches is refused with 400 naming it, on every route, and no engine sees the
// body; the switches themselves still pass.
func TestTemplateKwargsRefused(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))

	loop := func(n string) string {
		return `{% for i in range(` + n + `) %}{{ messages[-1]['content'] }}{% endfor %}`
	}
	var kwargs []string
	for _, n := range []string{"200", "2000000", "10**9", "(1<<30)", "messages|length*100000", "'9'|int", "range(5)|length"} {
		b, _ := json.Marshal(map[string]string{"chat_template": loop(n)})
		kwargs = append(kwargs, string(b))
	}
	kwargs = append(kwargs,
		`{"chat_template":"{{ messages }}","enable_thinking":false}`,
		`{"tokenize":true}`, `{"bos_token":"`+strings.Repeat("x", 4000)+`"}`, `{"eos_token":"x"}`,
		`{"add_generation_prompt":false}`, `{"continue_final_message":true}`, `{"documents":[{"text":"d"}]}`,
		`{"messages":[{"role":"user","content":"other"}]}`, `{"tools":[{"type":"function"}]}`,
		`{"pad_token":"x"}`, `{"unk_token":"x"}`, `{"Chat_Template":"x"}`, `{"enable_thinking":{"a":1}}`,
		`{"enable_thinking":[true]}`, `{"reasoning_effort":"`+strings.Repeat("high", 100)+`"}`, `[]`, `"x"`, `7`)

	type sent struct{ name, path, body string }
	var cases []sent
	for i, kw := range kwargs {
		cases = append(cases,
			sent{fmt.Sprintf("chat %d", i), "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":` + kw + `}`},
			sent{fmt.Sprintf("completions %d", i), "/v1/completions", `{"prompt":"hi","chat_template_kwargs":` + kw + `}`},
			sent{fmt.Sprintf("generate %d", i), "/generate", `{"text":"hi","chat_template_kwargs":` + kw + `}`},
			sent{fmt.Sprintf("generate sampling_params %d", i), "/generate", `{"text":"hi","sampling_params":{"chat_template_kwargs":` + kw + `}}`})
	}
	before := sim.Stats(t)
	for _, c := range cases {
		r := post(t, gw.URL, c.path, tenantKey, c.body)
		if r.status != 400 {
			t.Errorf("%s: want 400, got %d %.200s", c.name, r.status, r.body)
			continue
		}
		var e errorBody
		if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error.Param == nil || !strings.Contains(*e.Error.Param, "chat_template_kwargs") {
			t.Errorf("%s: the error does not name the field: %.300s", c.name, r.body)
		}
	}
	after := sim.Stats(t)
	for route, n := range after.Requests {
		if n != before.Requests[route] {
			t.Fatalf("a refused body reached the engine: %v → %v", before.Requests, after.Requests)
		}
	}

	for _, kw := range []string{`{"enable_thinking":false}`, `{"thinking":true,"reasoning_effort":"low"}`, `null`, `{}`} {
		r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"chat_template_kwargs":`+kw+`}`)
		if r.status != 200 {
			t.Errorf("switches %s: want 200, got %d %.200s", kw, r.status, r.body)
		}
	}
}
