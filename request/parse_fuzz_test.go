package request

import (
	"encoding/json"
	"testing"
)

// FuzzParseRequest: any bytes a client sends either parse into a request whose body re-encodes
// as a JSON object, or get a 400; never a panic.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"user","content":null}],"tools":[{"type":"function"}]}`,
		`{"prompt":["a","b"],"max_tokens":3,"n":2}`,
		`{"prompt":[[1,2],[3]]}`,
		`{"text":"x","sampling_params":{"max_new_tokens":5,"n":2}}`,
		`{"input_ids":[1,2,3]}`,
		`{"text":"x","rid":"y"}`,
		"{\"text\":\"\xff\"}",
		`[]`, `null`, `{}`, `{"messages":[{}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/gif;base64,R0lGODlhIAAQAAAAACw="}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]}]}`,
	} {
		f.Add(s)
	}
	rule, err := loadRule()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, kind := range []Kind{Chat, Completions, Generate} {
			r, e := Parse(kind, []byte(body))
			if e != nil {
				if e.Status != 400 || e.Code != "invalid_request" || e.Message == "" {
					t.Fatalf("bad error for %q: %+v", body, e)
				}
				continue
			}
			r.Render()
			if len(r.Prompts) == 0 {
				t.Fatalf("parsed %q with no prompt", body)
			}
			// Images: a 400 naming one, or every image charged (never a zero count).
			if e := r.CountImages(rule, true); e != nil {
				if e.Status != 400 || e.Param == "" {
					t.Fatalf("bad image error for %q: %+v", body, e)
				}
			} else if len(r.Images) > 0 && r.Prompts[0].ImageTokens < len(r.Images) {
				t.Fatalf("%d images charged %d tokens: %q", len(r.Images), r.Prompts[0].ImageTokens, body)
			}
			var out map[string]json.RawMessage
			if err := json.Unmarshal(mustJSON(r.Fields), &out); err != nil {
				t.Fatalf("re-encoded body is not JSON: %v", err)
			}
			if r.Output < 0 {
				t.Fatalf("negative output for %q", body)
			}
		}
	})
}
