package gateway_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// TestModelTemplateSwitches: with tokenizer.hf_dir, chat_template_kwargs also accepts the
// switches the model's own chat template reads (found by reading the template), and they are
// rendered in the count; a key the template does not read is refused naming it, and the refused
// names stay refused even when the template reads them (bos_token here).
func TestModelTemplateSwitches(t *testing.T) {
	qwen := hfref.ModelDir(t, "qwen3")
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(qwen, "tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	raw, err := os.ReadFile(filepath.Join(qwen, "tokenizer_config.json"))
	if err != nil || json.Unmarshal(raw, &cfg) != nil {
		t.Fatalf("qwen3 tokenizer_config.json: %v", err)
	}
	cfg["chat_template"] = `{{ bos_token }}{% if verbose_mode %}You answer at length, with every detail you know.{% endif %}` +
		`{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}` +
		`{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}`
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	sim := procs.StartSim(t, "--mode", "combined")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML(fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir), [3]string{"sim", sim.URL, "unified"})))

	send := func(kwargs string) reply {
		return post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"chat_template_kwargs":`+kwargs+`}`)
	}
	tokens := func(r reply) int {
		t.Helper()
		if r.status != 200 || r.header.Get("X-Kvgate-Tier") != "local" {
			t.Fatalf("%d tier %q: %s", r.status, r.header.Get("X-Kvgate-Tier"), r.body)
		}
		n, _ := strconv.Atoi(r.header.Get("X-Kvgate-Tokens"))
		return n
	}
	off, on := tokens(send(`{"verbose_mode":false}`)), tokens(send(`{"verbose_mode":true}`))
	if on <= off+5 {
		t.Errorf("the model's own switch is not in the count: %d tokens on, %d off", on, off)
	}
	tokens(send(`{"enable_thinking":true}`)) // a standard switch, which this template ignores
	for _, kw := range []string{`{"terse_mode":true}`, `{"bos_token":"x"}`, `{"messages":[]}`, `{"verbose_mode":{"a":1}}`} {
		r := send(kw)
		var e errorBody
		if r.status != 400 || json.Unmarshal(r.body, &e) != nil || e.Error.Param == nil || len(*e.Error.Param) < len("chat_template_kwargs.") ||
			(*e.Error.Param)[:len("chat_template_kwargs.")] != "chat_template_kwargs." {
			t.Errorf("%s: want 400 naming chat_template_kwargs.<key>, got %d %s", kw, r.status, r.body)
		}
	}
}
