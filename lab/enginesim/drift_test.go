package enginesim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// TestTemplateDriftAddsPromptTokens: with --bug template-drift every text prompt carries
// DriftTokens more than the same server without the bug counts (in every route's usage), and
// token-id prompts none.
func TestTemplateDriftAddsPromptTokens(t *testing.T) {
	plain := startInProcess(t, Config{})
	drift := startInProcess(t, Config{Bug: kvmodel.BugTemplateDrift, DriftTokens: 100})
	prompt := func(s *Server, path, body string) int {
		t.Helper()
		resp, err := http.Post("http://"+s.Addr()+path, "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				InputTokens  int `json:"input_tokens"`
			} `json:"usage"`
			MetaInfo struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"meta_info"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, err)
		}
		return r.Usage.PromptTokens + r.Usage.InputTokens + r.MetaInfo.PromptTokens
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello there"}],"max_tokens":2}`},
		{"/v1/completions", `{"prompt":"hello there","max_tokens":2}`},
		{"/generate", `{"text":"hello there","sampling_params":{"max_new_tokens":2}}`},
		{"/v1/messages", `{"messages":[{"role":"user","content":"hello there"}],"max_tokens":2}`},
		{"/v1/responses", `{"input":"hello there","max_output_tokens":2}`},
	} {
		if p, d := prompt(plain, c.path, c.body), prompt(drift, c.path, c.body); d != p+100 || p <= 0 {
			t.Errorf("%s: prompt tokens %d with the bug, %d without: want 100 more", c.path, d, p)
		}
	}
	ids := `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":2}}`
	if p, d := prompt(plain, "/generate", ids), prompt(drift, "/generate", ids); p != 3 || d != 3 {
		t.Errorf("token ids: %d with the bug, %d without: want 3 both", d, p)
	}
}
