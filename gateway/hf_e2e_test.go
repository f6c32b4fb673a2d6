package gateway_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
	"github.com/kvgate/kvgate/tokenize/hf"
)

// With tokenizer.hf_dir naming Qwen3's tokenizer files, in front of a simulator that renders and
// tokenizes with the same files (--tokenizer hf:DIR, as SGLang serving Qwen3 does): chat prompts
// whose engine count lies around the engine's limit are admitted exactly when the engine admits
// them, X-Kvgate-Tokens is Hugging Face's own count of the rendered prompt (@huggingface/jinja
// + @huggingface/tokenizers, run with node), the tier says "local", and the engine's /tokenize is
// never called.
func TestHFTokenizerCountsLikeTheEngine(t *testing.T) {
	dir := hfref.ModelDir(t, "qwen3")
	tk, err := hf.Load(dir) // only to size the prompts around the limit
	if err != nil {
		t.Fatal(err)
	}
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "hf:"+dir, "--pool-tokens", "2048", "--context-length", "4096")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML(fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir), [3]string{"sim", sim.URL, "unified"})))
	const limit = 2041 // max_req_input_len 2042 − 1; max_tokens 1 keeps P + O under the context

	tools := `[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]`
	pieces := []string{"alpha", "beta", "gamma", "delta", "缓存", "数据", "😀", "x=1;", "\n", "don't", "  ", "Ünïcödé", "<think>", "42"}
	rng := rand.New(rand.NewSource(19))
	var bodies []string
	var chats []hfref.Chat
	for i := range 24 {
		target := limit - 24 + 2*i // engine counts from limit−24 to limit+22
		withTools := i%3 == 0
		var b strings.Builder
		var msgs string
		for {
			content, _ := json.Marshal(b.String())
			msgs = fmt.Sprintf(`[{"role": "system", "content": "Be brief."}, {"role": "user", "content": %s}]`, content)
			var toolsRaw json.RawMessage
			if withTools {
				toolsRaw = json.RawMessage(tools)
			}
			text, err := tk.Render(json.RawMessage(msgs), toolsRaw, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := tk.Count(text, -1); n >= target {
				break
			}
			b.WriteString(pieces[rng.Intn(len(pieces))])
			b.WriteByte(' ')
		}
		chat := hfref.Chat{Messages: json.RawMessage(msgs), AddGenerationPrompt: true}
		body := fmt.Sprintf(`{"model": "m", "messages": %s, "max_tokens": 1`, msgs)
		if withTools {
			chat.Tools = json.RawMessage(tools)
			body += `, "tools": ` + tools
		}
		chats, bodies = append(chats, chat), append(bodies, body+"}")
	}
	ref := hfref.Reference(t, "qwen3", nil, chats)
	outcomes := map[string]int{}
	for i, body := range bodies {
		want := ref.RenderCounts[i]
		if want < 0 {
			t.Fatalf("chat %d: the reference could not render it: %s", i, ref.Renders[i])
		}
		engine := post(t, sim.URL, "/v1/chat/completions", "", body)
		r := post(t, gw.URL, "/v1/chat/completions", tenantKey, body)
		if got := r.header.Get("X-Kvgate-Tokens"); got != fmt.Sprint(want) {
			t.Errorf("chat %d: X-Kvgate-Tokens %s, reference count %d", i, got, want)
		}
		if tier := r.header.Get("X-Kvgate-Tier"); tier != "local" {
			t.Errorf("chat %d: tier %q, want local", i, tier)
		}
		switch {
		case engine.status == 200 && r.status == 200:
			outcomes["both_admit"]++
		case engine.status == 400 && r.status == 413:
			outcomes["both_refuse"]++
		default:
			t.Errorf("chat %d (%d tokens): engine answered %d, gateway %d: %s", i, want, engine.status, r.status, r.body)
		}
		if (r.status == 200) != (want <= limit) {
			t.Errorf("chat %d: %d tokens against the limit %d, gateway answered %d", i, want, limit, r.status)
		}
	}
	if outcomes["both_admit"] == 0 || outcomes["both_refuse"] == 0 {
		t.Fatalf("the band should give both outcomes: %v", outcomes)
	}
	st := sim.Stats(t)
	if st.TokenizeRequests != 0 || st.Requests["/tokenize"] != 0 {
		t.Fatalf("the engine's /tokenize was called: %d", st.TokenizeRequests)
	}
	t.Logf("outcomes: %v", outcomes)
}
