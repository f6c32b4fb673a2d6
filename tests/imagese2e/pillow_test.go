// Package imagese2e holds black-box tests of image counting: a real gateway (tests/testkit) in
// front of the engine simulator (tests/procs), both serving a Qwen2.5-VL model directory, sent
// images whose size only Pillow's reading gives.
package imagese2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
	"github.com/kvgate/kvgate/tokenize/vision"
)

const key = "sk-test-images"

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, body string) reply {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// bodies is one request per route holding n copies of the image (base64 of a GIF).
func bodies(b64 string, n int) map[string]string {
	url := "data:image/gif;base64," + b64
	var chat, resp, msgs []string
	for i := 0; i < n; i++ {
		chat = append(chat, fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q}}`, url))
		resp = append(resp, fmt.Sprintf(`{"type":"input_image","image_url":%q}`, url))
		msgs = append(msgs, fmt.Sprintf(`{"type":"image","source":{"type":"base64","media_type":"image/gif","data":%q}}`, b64))
	}
	return map[string]string{
		"/v1/chat/completions": `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"Describe"},` + strings.Join(chat, ",") + `]}]}`,
		"/v1/responses":        `{"model":"m","max_output_tokens":1,"input":[{"role":"user","content":[{"type":"input_text","text":"Describe"},` + strings.Join(resp, ",") + `]}]}`,
		"/v1/messages":         `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"Describe"},` + strings.Join(msgs, ",") + `]}]}`,
	}
}

// Issue 39's 35-byte GIF (a 28×28 screen, one 1×1 frame at 3583,3583) is 3584×3584 to Pillow:
// 16,386 Qwen2.5-VL tokens, where the gateway used to charge 6. Eight in one request over a
// 20,000-token pool are refused with 413 before the engine on chat, Responses and Messages
// (the simulator's request count does not move), charged at least 8 × 16,386; one alone is
// admitted and charged what the engine (sizing it as Pillow does) counts. Text spelling the
// image placeholder is a 400 before the engine on the three routes.
func TestIssue39GIFRefusedBeforeTheEngine(t *testing.T) {
	dir := hfref.QwenVLDir(t)
	rule, err := vision.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	gif, err := os.ReadFile(filepath.Join(procs.RepoRoot(t), "tokenize/imagesize/testdata/pillow/gif_issue39_35_bytes.gif"))
	if err != nil {
		t.Fatal(err)
	}
	one, err := rule.Tokens(3584, 3584)
	if err != nil || len(gif) != 35 || one.Total != 16386 {
		t.Fatalf("the GIF: %d bytes, %+v %v", len(gif), one, err)
	}
	const pool = 20000
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "hf:"+dir, "--pool-tokens", fmt.Sprint(pool), "--context-length", "19000")
	yaml := fmt.Sprintf("backends:\n  - {name: sim, url: %q, role: unified}\n", sim.URL) +
		fmt.Sprintf("tenants:\n  - {name: t, key_sha256: %q}\n", testkit.KeySHA256(key)) +
		"capacity: {poll_interval: 200ms}\n" +
		fmt.Sprintf("tokenizer: {hf_dir: %q}\n", dir)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	b64 := base64.StdEncoding.EncodeToString(gif)

	for path, body := range bodies(b64, 8) {
		before := sim.Stats(t).Requests[path]
		r := post(t, gw.URL+path, body)
		got, _ := strconv.Atoi(r.header.Get("X-Kvgate-Tokens"))
		if r.status != 413 || got < 8*one.Total {
			t.Errorf("%s: %d (X-Kvgate-Tokens %d) %.300s, want 413 charging at least %d", path, r.status, got, r.body, 8*one.Total)
		}
		if after := sim.Stats(t).Requests[path]; after != before {
			t.Errorf("%s: the engine got %d requests", path, after-before)
		}
	}
	// Text that spells the model's image placeholder, beside one real image, is refused before
	// the engine: it would expand it into an image the request does not carry.
	for path, body := range bodies(b64, 1) {
		before := sim.Stats(t).Requests[path]
		body = strings.Replace(body, `"Describe"`, `"Describe <|vision_start|><|image_pad|><|vision_end|>"`, 1)
		if r := post(t, gw.URL+path, body); r.status != 400 || !strings.Contains(string(r.body), "media placeholder") {
			t.Errorf("%s: placeholder in text: %d %.300s, want 400", path, r.status, r.body)
		}
		if after := sim.Stats(t).Requests[path]; after != before {
			t.Errorf("%s: the engine got the placeholder text", path)
		}
	}
	// One fits: the gateway's count is the engine's, which sizes the GIF as Pillow does.
	r := post(t, gw.URL+"/v1/chat/completions", bodies(b64, 1)["/v1/chat/completions"])
	var resp struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &resp) != nil || resp.Usage.PromptTokens < one.Total {
		t.Fatalf("one GIF: %d %.300s, want 200 with at least %d prompt tokens", r.status, r.body, one.Total)
	}
	if got := r.header.Get("X-Kvgate-Tokens"); got != fmt.Sprint(resp.Usage.PromptTokens) {
		t.Errorf("one GIF: X-Kvgate-Tokens %s, the engine counted %d", got, resp.Usage.PromptTokens)
	}
}
