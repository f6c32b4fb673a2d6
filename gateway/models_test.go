package gateway_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Two models with different pools behind one gateway (two simulators): a prompt the small
// model's pool cannot hold is refused for it and served by the big one (named by an alias);
// each model's own max_model_len in /v1/models; an unknown model is 404 model_not_found in every
// route's envelope; native routes without a model field go to the first model.
func TestTwoModelsRouteByModel(t *testing.T) {
	small := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "2048", "--context-length", "4096")
	big := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "16384", "--context-length", "32768")
	yaml := fmt.Sprintf(`backends:
  - {name: small-0, url: %q, role: unified, model: small}
  - {name: big-0, url: %q, role: unified, model: big}
models:
  - {name: small, tokenizer: {encoding: o200k_base}}
  - {name: big, aliases: [big-latest]}
tenants:
  - {name: alice, key_sha256: %q}
capacity: {poll_interval: 200ms}
`, small.URL, big.URL, testkit.KeySHA256(tenantKey))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	chat := func(model, content string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":4}`, model, content)
	}
	count := func(s *procs.Sim) int { return s.Stats(t).Requests["/v1/chat/completions"] }
	s0, b0 := count(small), count(big)

	long := words(1500)
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, chat("small", long))
	if r.status != 413 || decodeError(t, r).Error.Code != "context_length_exceeded" {
		t.Fatalf("a prompt over the small pool, for small: %d %s", r.status, r.body)
	}
	if n, _ := strconv.Atoi(r.header.Get("X-Kvgate-Tokens")); n <= 2048 {
		t.Fatalf("the long prompt counted %d tokens: it should not fit a 2048-token pool", n)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, chat("big-latest", long)); r.status != 200 {
		t.Fatalf("the same prompt for big (by its alias): %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, chat("small", "hello there")); r.status != 200 {
		t.Fatalf("a short prompt for small: %d %s", r.status, r.body)
	}
	if s, b := count(small)-s0, count(big)-b0; s != 1 || b != 1 {
		t.Fatalf("small engine saw %d chats, big %d: want one each (the refused one reached none)", s, b)
	}

	// Unknown model: 404 model_not_found, in the route's envelope.
	r = post(t, gw.URL, "/v1/chat/completions", tenantKey, chat("gpt-9", "hi"))
	if e := decodeError(t, r); r.status != 404 || e.Error.Code != "model_not_found" || !strings.Contains(e.Error.Message, "gpt-9") {
		t.Fatalf("unknown model on chat: %d %s", r.status, r.body)
	}
	r = post(t, gw.URL, "/v1/responses", tenantKey, `{"model":"gpt-9","input":"hi","max_output_tokens":4}`)
	if r.status != 404 || decodeError(t, r).Error.Code != "model_not_found" {
		t.Fatalf("unknown model on responses: %d %s", r.status, r.body)
	}
	r = post(t, gw.URL, "/v1/messages", tenantKey, `{"model":"gpt-9","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	var anth struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if json.Unmarshal(r.body, &anth) != nil || r.status != 404 || anth.Type != "error" || anth.Error.Type != "not_found_error" {
		t.Fatalf("unknown model on messages: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"hi"}]}`); r.status != 400 || *decodeError(t, r).Error.Param != "model" {
		t.Fatalf("no model: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/tokenize", tenantKey, `{"model":"nope","prompt":"hi"}`); r.status != 404 {
		t.Fatalf("tokenize for an unknown model: %d %s", r.status, r.body)
	}

	// /v1/models: each model with its own limit.
	var list struct {
		Data []struct {
			ID          string   `json:"id"`
			MaxModelLen int      `json:"max_model_len"`
			Aliases     []string `json:"aliases"`
		} `json:"data"`
	}
	r = get(t, gw.URL+"/v1/models", tenantKey)
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Data) != 2 {
		t.Fatalf("/v1/models: %d %s", r.status, r.body)
	}
	lens := map[string]int{}
	for _, m := range list.Data {
		lens[m.ID] = m.MaxModelLen
	}
	if lens["small"] <= 0 || lens["small"] > 2048 || lens["big"] <= 2048 || lens["big"] > 16384 {
		t.Fatalf("per-model max_model_len: %v", lens)
	}
	var one struct {
		ID          string `json:"id"`
		MaxModelLen int    `json:"max_model_len"`
	}
	r = get(t, gw.URL+"/v1/models/big-latest", tenantKey)
	if json.Unmarshal(r.body, &one) != nil || r.status != 200 || one.ID != "big" || one.MaxModelLen != lens["big"] {
		t.Fatalf("/v1/models/big-latest: %d %s", r.status, r.body)
	}
	if r := get(t, gw.URL+"/v1/models/gpt-9", tenantKey); r.status != 404 || decodeError(t, r).Error.Code != "model_not_found" {
		t.Fatalf("/v1/models/gpt-9: %d %s", r.status, r.body)
	}

	// SGLang's native /generate has no model field: the first model configured serves it.
	g0 := small.Stats(t).Requests["/generate"]
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hello","sampling_params":{"max_new_tokens":4}}`); r.status != 200 {
		t.Fatalf("/generate: %d %s", r.status, r.body)
	}
	if small.Stats(t).Requests["/generate"] != g0+1 {
		t.Fatalf("/generate did not go to the first model's engine")
	}
}

// One model (no model anywhere): /v1/models/{id} answers for the engines' own id.
func TestSingleModelByID(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	r := get(t, gw.URL+"/v1/models", tenantKey)
	if json.Unmarshal(r.body, &list) != nil || len(list.Data) != 1 || list.Data[0].ID == "" {
		t.Fatalf("/v1/models: %d %s", r.status, r.body)
	}
	if r := get(t, gw.URL+"/v1/models/"+list.Data[0].ID, tenantKey); r.status != 200 {
		t.Fatalf("/v1/models/%s: %d %s", list.Data[0].ID, r.status, r.body)
	}
	if r := get(t, gw.URL+"/v1/models/other", tenantKey); r.status != 404 || decodeError(t, r).Error.Code != "model_not_found" {
		t.Fatalf("/v1/models/other: %d %s", r.status, r.body)
	}
}
