package gateway_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// The bodies the official SDKs send (recorded from openai and @anthropic-ai/sdk on npm, see the
// file's header) are served through the gateway as the SDKs send them, and a refusal carries
// the envelope fields each SDK reads: error.message/type/code/param for OpenAI's,
// type + error.type/message for Anthropic's.
func TestOfficialSDKShapes(t *testing.T) {
	raw, err := os.ReadFile("testdata/sdk/recorded.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Requests map[string]struct {
			Headers map[string]string `json:"headers"`
			Body    json.RawMessage   `json:"body"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || len(rec.Requests) < 9 {
		t.Fatalf("recorded requests: %v (%d)", err, len(rec.Requests))
	}
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, routesYAML("", [3]string{"sim", sim.URL, "unified"})))
	for name, r := range rec.Requests {
		path, kind, _ := strings.Cut(name, " ")
		h := map[string]string{}
		if r.Headers["x-api-key"] != "" {
			h["x-api-key"] = tenantKey
			h["anthropic-version"] = r.Headers["anthropic-version"]
		} else {
			h["Authorization"] = "Bearer " + tenantKey
		}
		got := postH(t, gw.URL+path, string(r.Body), h)
		if got.status != 200 {
			t.Errorf("%s: %d %s", name, got.status, got.body)
			continue
		}
		if kind == "stream" && !strings.HasPrefix(got.header.Get("Content-Type"), "text/event-stream") {
			t.Errorf("%s: not a stream: %v", name, got.header)
		}
	}
	// Refusals, as each SDK parses them.
	big := words(6000)
	chat := bytes.Replace(rec.Requests["/v1/chat/completions plain"].Body, []byte(`"hello"`), []byte(`"`+big+`"`), 1)
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, string(chat))
	var oa struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Code    *string `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	if r.status != 413 || json.Unmarshal(r.body, &oa) != nil || oa.Error == nil || oa.Error.Message == nil || oa.Error.Type == nil ||
		oa.Error.Code == nil || *oa.Error.Code != "context_length_exceeded" {
		t.Fatalf("OpenAI SDK's error fields: %d %s", r.status, r.body)
	}
	msg := bytes.Replace(rec.Requests["/v1/messages plain"].Body, []byte(`"hello"`), []byte(`"`+big+`"`), 1)
	r = postH(t, gw.URL+"/v1/messages", string(msg), map[string]string{"x-api-key": tenantKey})
	var an struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if r.status != 413 || json.Unmarshal(r.body, &an) != nil || an.Type != "error" || an.Error == nil ||
		an.Error.Type != "request_too_large" || an.Error.Message == "" {
		t.Fatalf("Anthropic SDK's error fields: %d %s", r.status, r.body)
	}
}
