package hfref

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
)

// QwenVLDir is a Qwen2.5-VL model directory for tests: Qwen2.5-VL's chat template
// (tokenize/vision/testdata/qwen2_5_vl/chat_template.jinja, as its tokenizer_config.json ships it)
// and preprocessor_config.json over Qwen3's tokenizer.json from the reference packages (the same
// byte-level BPE, vocabulary and vision special tokens <|vision_start|>, <|image_pad|>,
// <|vision_end|> at the same ids; Qwen3 adds <think> and </think>). Skips like ModelDir
// without the reference packages.
func QwenVLDir(t testing.TB) string {
	t.Helper()
	src := ModelDir(t, "qwen3")
	fix := filepath.Join(procs.RepoRoot(t), "tokenize", "vision", "testdata", "qwen2_5_vl")
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(src, "tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(fix, "chat_template.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"], _ = json.Marshal(string(tmpl))
	out, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	pre, err := os.ReadFile(filepath.Join(fix, "preprocessor_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "preprocessor_config.json"), pre, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
