package gateway_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/tests/markerhour"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Whatever the hour, every generation route hands the engine a marked prompt: the requester's
// marker of that hour at the end of the system text (chat, Responses, Messages) or before the
// prompt (completions, /generate), and, with every_bytes, repeated through the text of chat,
// completions and /generate, no stretch of it longer than every_bytes and a word. The marker is
// the one input to injection that changes by the hour; this sweeps 48 of them, whole and
// streamed (issue 37 asked whether some hour lets a marked prompt reach an engine unmarked).
func TestPromptsReachTheEngineMarkedAtEveryHour(t *testing.T) {
	const secret, every = "marked-prompts-secret-of-32-bytes", 48
	sim, err := enginesim.New(enginesim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]byte{} // the last body the engine received on each route
	handler := sim.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(ctx *fasthttp.RequestCtx) {
		if ctx.IsPost() {
			mu.Lock()
			got[string(ctx.Path())] = append([]byte(nil), ctx.PostBody()...)
			mu.Unlock()
		}
		handler(ctx)
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })

	prose := tenantProse(37, 120) // about 650 bytes: a dozen repetitions
	p, _ := json.Marshal(prose)
	bodies := []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"system","content":"You answer."},{"role":"user","content":%s}],"max_tokens":4,"stream":%v}`},
		{"chat parts, no system", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":[{"type":"text","text":%s}]}],"max_tokens":4,"stream":%v}`},
		{"completions", "/v1/completions", `{"model":"sim","prompt":%s,"max_tokens":4,"stream":%v}`},
		{"generate", "/generate", `{"text":%s,"sampling_params":{"max_new_tokens":4},"stream":%v}`},
		{"responses", "/v1/responses", `{"model":"sim","instructions":"You answer.","input":%s,"max_output_tokens":4,"stream":%v}`},
		{"messages", "/v1/messages", `{"model":"sim","system":"You answer.","messages":[{"role":"user","content":%s}],"max_tokens":4,"stream":%v}`},
	}
	for h := 0; h < 48; h++ {
		at := time.Date(2026, 12, 4, h, 0, 0, 0, time.UTC)
		cfg := testkit.ParseConfig(t, fmt.Sprintf(`backends: [{name: eng, url: "http://%s", role: unified}]
tenants: [{name: alice, key_sha256: %q}]
capacity: {poll_interval: 1h}
canary: {enabled: true, secret: %s, every_bytes: %d}
`, ln.Addr(), testkit.KeySHA256(tenantKey), secret, every))
		cfg.Canary.Epoch = markerhour.EpochLenAt(at)
		gw := testkit.StartGateway(t, cfg)
		marker := markerhour.MarkerAt(secret, "alice", at)
		for _, b := range bodies {
			for _, stream := range []bool{false, true} {
				if r := post(t, gw.URL, b.path, tenantKey, fmt.Sprintf(b.body, p, stream)); r.status != 200 {
					t.Fatalf("%s, %s stream=%v: %d %s", at.Format("Jan 2 15:04"), b.name, stream, r.status, r.body)
				}
				mu.Lock()
				sent := got[b.path]
				mu.Unlock()
				texts := jsonStrings(t, sent)
				all := strings.Join(texts, "\n")
				if !strings.Contains(all, marker) {
					t.Fatalf("%s, %s stream=%v: the engine got no marker of alice's: %s", at.Format("Jan 2 15:04"), b.name, stream, sent)
				}
				if strings.Count(all, canary.MarkerPrefix) != strings.Count(all, marker) {
					t.Fatalf("%s, %s: a marker not alice's of this hour: %s", at.Format("Jan 2 15:04"), b.name, sent)
				}
				if b.name == "responses" || b.name == "messages" {
					continue // the system text's marker only: every_bytes does not reach their turns
				}
				text := ""
				for _, s := range texts {
					if strings.Contains(s, prose[:40]) || strings.Contains(s, prose[len(prose)-20:]) {
						text = s
					}
				}
				pieces := strings.Split(text, marker)
				if len(pieces) < len(prose)/every {
					t.Fatalf("%s, %s: %d markers in the prompt text, want about one per %d bytes: %q", at.Format("Jan 2 15:04"), b.name, len(pieces)-1, every, text)
				}
				for _, piece := range pieces {
					if len(piece) > every+16 { // a stretch ends at the first space after every bytes
						t.Fatalf("%s, %s: %d bytes of prompt without a marker: %q", at.Format("Jan 2 15:04"), b.name, len(piece), piece)
					}
				}
			}
		}
	}
}

// jsonStrings is every string value of a JSON body.
func jsonStrings(t *testing.T, body []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("engine body %q: %v", body, err)
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}
