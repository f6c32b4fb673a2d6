package request

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// fieldsDoc renders the field table as docs/fields.md has it.
func fieldsDoc() string {
	var b strings.Builder
	b.WriteString("# Request fields: the table admission works from\n\n")
	b.WriteString("Generated from `request/fields.go` (`KVGATE_UPDATE_DOCS=1 go test ./request -run TestFieldsDocIsCurrent`);\n")
	b.WriteString("`TestFieldsDocIsCurrent` fails when this file and the table differ.\n\n")
	b.WriteString("Every field a route's engine reads has a verdict: **modeled** (its effect on the rendered prompt\n")
	b.WriteString("is in the count), **inert** (it cannot change the prompt) or **refused** (`400` in the route's\n")
	b.WriteString("envelope, naming the field, before any engine is contacted). A field with no row is refused\n")
	b.WriteString("wherever it sits. Paths: `a.b` is key `b` of object `a` (of each object when `a` is an array),\n")
	b.WriteString("`[]` marks an array of objects, `[type=x]` the objects whose `type` is `x` (`[type=]`: none\n")
	b.WriteString("given). A row with no rows below it takes its value whole (a string, a number, or JSON such as a\n")
	b.WriteString("tool's schema). `chat_template_kwargs` also accepts the switches the served model's own template\n")
	b.WriteString("reads (`tokenizer.hf_dir`), never the refused names nor any `*_token` variable.\n\n")
	b.WriteString("Thinking budgets (`thinking_token_budget`, `sampling_params.thinking_budget`, Anthropic's\n")
	b.WriteString("`thinking.budget_tokens`) cap tokens inside the requested output (`max_tokens`,\n")
	b.WriteString("`max_new_tokens`): they add nothing to the output admission reserves. A template's own\n")
	b.WriteString("`chat_template_kwargs.thinking_budget` passes only where the served model's template reads it.\n")
	b.WriteString("Client request ids never reach an engine: `rid` is refused, and the engine gets the gateway's\n")
	b.WriteString("own id in `rid` and `X-Request-Id` while the client gets its `X-Request-Id` back.\n")
	for k := Kind(0); k < Kinds; k++ {
		fmt.Fprintf(&b, "\n## `%s`\n\n| field | verdict | why refused |\n|---|---|---|\n", k.Path())
		for _, r := range FieldVerdicts(k) {
			why := r.Reason
			if r.Policy != "" {
				why += " (allowed by `" + r.Policy + "`)"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.Path, r.Verdict, why)
		}
	}
	return b.String()
}

// TestFieldsDocIsCurrent: docs/fields.md is the field table as it is.
func TestFieldsDocIsCurrent(t *testing.T) {
	const path = "../docs/fields.md"
	want := fieldsDoc()
	if os.Getenv("KVGATE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not the field table: run KVGATE_UPDATE_DOCS=1 go test ./request -run TestFieldsDocIsCurrent", path)
	}
}
