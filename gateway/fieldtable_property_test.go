package gateway_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// TestAdmittedBoundNeverBelowReference (issue 30): chat bodies drawn at random from the field
// table's chat rows (modeled fields: system, user, assistant and tool messages, text parts, names,
// tool calls with their arguments, reasoning, tools, the template switches, add_generation_prompt,
// continue_final_message, reasoning_effort; inert fields: sampling, streaming, output lengths,
// metadata) are admitted by a gateway counting with Qwen3's own files (tier local) with a bound
// (X-Kvgate-Tokens) never below Hugging Face's own rendering and count of the same conversation as
// the engine receives it (@huggingface/jinja and @huggingface/tokenizers, run with node).
func TestAdmittedBoundNeverBelowReference(t *testing.T) {
	dir := hfref.ModelDir(t, "qwen3")
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "hf:"+dir, "--pool-tokens", "65536", "--context-length", "65536")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML(fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir), [3]string{"sim", sim.URL, "unified"})))

	rng := rand.New(rand.NewSource(30))
	words := []string{"alpha", "beta", "缓存", "数据", "😀", "x=1;", "\n", "don't", "  ", "Ünïcödé", "<think>", "</think>", "42", "<tool_call>", "{\"a\": 1}"}
	text := func() string {
		var b strings.Builder
		for range 1 + rng.Intn(12) {
			b.WriteString(words[rng.Intn(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	js := func(v any) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	const tools = `[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": false}}]`

	const cases = 60
	var bodies []string
	var chats []hfref.Chat
	for range cases {
		// The conversation as the client sends it, and as the engine hands it to the template
		// (text parts joined, tool-call arguments decoded): the reference renders the latter.
		var sent, engine []map[string]any
		add := func(m map[string]any, e map[string]any) {
			sent, engine = append(sent, m), append(engine, e)
		}
		if rng.Intn(2) == 0 {
			s := text()
			add(map[string]any{"role": "system", "content": s}, map[string]any{"role": "system", "content": s})
		}
		user := func() {
			if rng.Intn(3) == 0 {
				a, b := text(), text()
				m := map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": a}, map[string]any{"type": "text", "text": b}}}
				e := map[string]any{"role": "user", "content": a + " " + b}
				if rng.Intn(3) == 0 {
					m["name"], e["name"] = "bob", "bob"
				}
				add(m, e)
				return
			}
			s := text()
			add(map[string]any{"role": "user", "content": s}, map[string]any{"role": "user", "content": s})
		}
		user()
		for range rng.Intn(3) {
			m, e := map[string]any{"role": "assistant"}, map[string]any{"role": "assistant"}
			c := text()
			m["content"], e["content"] = c, c
			if rng.Intn(2) == 0 {
				r := text()
				m["reasoning_content"], e["reasoning_content"] = r, r
			}
			call := rng.Intn(2) == 0
			if call {
				args := map[string]any{"city": text()}
				m["tool_calls"] = []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": js(args)}}}
				e["tool_calls"] = []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": args}}}
			}
			add(m, e)
			if call {
				out := text()
				add(map[string]any{"role": "tool", "content": out, "tool_call_id": "call_1"}, map[string]any{"role": "tool", "content": out, "tool_call_id": "call_1"})
			}
			user()
		}
		body := map[string]any{"model": "qwen3", "messages": sent}
		chat := hfref.Chat{Messages: json.RawMessage(js(engine)), AddGenerationPrompt: true}
		if rng.Intn(2) == 0 {
			body["tools"], chat.Tools = json.RawMessage(tools), json.RawMessage(tools)
		}
		switch rng.Intn(4) {
		case 0:
			body["chat_template_kwargs"], chat.Kwargs = map[string]any{"enable_thinking": false}, json.RawMessage(`{"enable_thinking": false}`)
		case 1:
			body["chat_template_kwargs"], chat.Kwargs = map[string]any{"enable_thinking": true, "thinking": true}, json.RawMessage(`{"enable_thinking": true, "thinking": true}`)
		}
		switch rng.Intn(5) {
		case 0:
			body["add_generation_prompt"], chat.AddGenerationPrompt = false, false
		case 1:
			// Continue the last assistant message: the engine renders without a generation prompt.
			c := text()
			body["messages"] = append(sent, map[string]any{"role": "assistant", "content": c})
			chat.Messages = json.RawMessage(js(append(engine, map[string]any{"role": "assistant", "content": c})))
			body["continue_final_message"], chat.AddGenerationPrompt = true, false
		}
		if rng.Intn(3) == 0 {
			body["reasoning_effort"] = "low" // Qwen3's template does not read it
		}
		// Inert fields: they cannot change the prompt.
		for _, f := range []struct {
			k string
			v any
		}{{"temperature", 0.5}, {"top_p", 0.9}, {"max_tokens", 2}, {"stop", []string{"\n\n"}}, {"seed", 7}, {"stream", false},
			{"stream_options", map[string]any{"include_usage": true}}, {"metadata", map[string]any{"k": "v"}}, {"user", "u"},
			{"tool_choice", "auto"}, {"logit_bias", map[string]any{"1": 0}}, {"n", 1}} {
			if rng.Intn(2) == 0 {
				body[f.k] = f.v
			}
		}
		if _, ok := body["max_tokens"]; !ok {
			body["max_completion_tokens"] = 2
		}
		if body["stream"] == true {
			delete(body, "stream")
		}
		bodies, chats = append(bodies, js(body)), append(chats, chat)
	}
	ref := hfref.Reference(t, "qwen3", nil, chats)
	rendered := 0
	for i, body := range bodies {
		want := ref.RenderCounts[i]
		r := post(t, gw.URL, "/v1/chat/completions", tenantKey, body)
		if want < 0 {
			// The template refused the conversation (raise_exception): so must the gateway.
			if r.status != 400 {
				t.Errorf("case %d: the reference refused it (%s), the gateway answered %d", i, ref.Renders[i], r.status)
			}
			continue
		}
		rendered++
		if r.status != 200 {
			t.Errorf("case %d: %d %.300s\nbody %s", i, r.status, r.body, body)
			continue
		}
		got, err := strconv.Atoi(r.header.Get("X-Kvgate-Tokens"))
		if err != nil || r.header.Get("X-Kvgate-Tier") != "local" {
			t.Errorf("case %d: X-Kvgate-Tokens %q tier %q", i, r.header.Get("X-Kvgate-Tokens"), r.header.Get("X-Kvgate-Tier"))
			continue
		}
		if got < want {
			t.Errorf("case %d: admitted bound %d below the reference count %d\nbody %s\nreference %s", i, got, want, body, ref.Renders[i])
		}
	}
	if rendered < cases*3/4 {
		t.Fatalf("only %d of %d cases rendered by the reference: the draw tests too little", rendered, cases)
	}
}
