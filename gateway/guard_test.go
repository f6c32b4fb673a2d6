package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tenants"
	"github.com/kvgate/kvgate/tests/markerhour"
)

func guardGateway(t testing.TB) *Gateway {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
backends: [{name: sim, url: "http://127.0.0.1:1", role: unified}]
tenants: [{name: alice, key_sha256: %q}, {name: bob, key_sha256: %q}]
canary: {enabled: true, secret: guard-test-secret-padded-to-32-bytes}
server: {metrics_key_sha256: %q}
`, config.SHA256Hex("ka"), config.SHA256Hex("kb"), config.SHA256Hex("scrape-key"))), nil)
	if err != nil {
		t.Fatal(err)
	}
	markerhour.Pin(cfg)
	set, _ := backends.New(cfg.Backends, backends.OptionsFrom(cfg), zap.NewNop())
	g, err := New(cfg, set, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func chatChunk(content string) []byte {
	b, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": content}}}})
	return []byte("data: " + string(b) + "\n\n")
}

func TestGuardStreams(t *testing.T) {
	g := guardGateway(t)
	bobMarker := markerOf(g, "bob")
	aliceMarker := markerOf(g, "alice")
	alice := &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}
	newX := func(kind request.Kind) *exchange {
		return watched(&exchange{g: g, tenant: alice, kind: kind, rid: "r", route: &backends.Route{}})
	}

	t.Run("ordinary events pass with the same content", func(t *testing.T) {
		gd := streamOf(newX(request.Chat))
		for _, ev := range [][]byte{chatChunk(" Paris"), chatChunk(" is nice")} {
			out, ok := gd.event(ev)
			if !ok || !sameEvent(out, ev) {
				t.Fatalf("changed %q into %q", ev, out)
			}
		}
		if out, ok := gd.event([]byte(": keep-alive\n\n")); !ok || len(out) != 0 {
			t.Fatalf("a comment is dropped, not sent: %q", out)
		}
	})
	t.Run("a foreign marker split across events is cut before it is sent", func(t *testing.T) {
		gd := streamOf(newX(request.Chat))
		var sent []byte
		for _, piece := range []string{"Sure, here: K", "VG-" + bobMarker[4:10], bobMarker[10:] + " more"} {
			out, ok := gd.event(chatChunk(piece))
			if !ok {
				if gd.leak == nil || gd.leak.Victim != "bob" {
					t.Fatalf("cut without the victim: %+v", gd.leak)
				}
				if bytes.Contains(sent, []byte("KVG")) {
					t.Fatalf("marker bytes were sent before the cut: %s", sent)
				}
				return
			}
			sent = append(sent, out...)
		}
		t.Fatalf("foreign marker not caught; sent %s", sent)
	})
	t.Run("own marker stripped from cumulative /generate text", func(t *testing.T) {
		gd := streamOf(newX(request.Generate))
		var last string
		for _, text := range []string{"The", "The answer " + aliceMarker[:6], "The answer " + aliceMarker + " is 42"} {
			b, _ := json.Marshal(map[string]any{"text": text, "meta_info": map[string]any{"id": "x"}})
			out, ok := gd.event([]byte("data: " + string(b) + "\n\n"))
			if !ok {
				t.Fatal("own marker must not cut")
			}
			var ev struct{ Text string }
			_ = json.Unmarshal(bytes.TrimSpace(bytes.TrimPrefix(out, []byte("data: "))), &ev)
			if strings.Contains(ev.Text, "KVG") || !strings.HasPrefix(ev.Text, last) {
				t.Fatalf("cumulative text wrong: %q after %q", ev.Text, last)
			}
			last = ev.Text
		}
		if last != "The answer  is 42" {
			t.Fatalf("final text %q", last)
		}
	})
	t.Run("markers in other event shapes are caught too", func(t *testing.T) {
		gd := streamOf(newX(request.Chat))
		if _, ok := gd.event([]byte("data: {\"a\":1}\ndata: " + bobMarker + "\n\n")); ok {
			t.Fatal("a multi-line event with a foreign marker passed")
		}
		gd = streamOf(newX(request.Chat))
		ev := []byte(`data: {"choices":[{"index":0,"logprobs":{"content":[{"token":"` + bobMarker + `"}]},"delta":{"content":"x"}}]}` + "\n\n")
		if _, ok := gd.event(ev); ok {
			t.Fatal("a foreign marker in logprobs passed")
		}
	})
	t.Run("markers split across pieces of tool-call arguments or logprob tokens are cut", func(t *testing.T) {
		toolChunk := func(args string) []byte {
			b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{
				"content": "", "tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": args}}}}}}})
			return []byte("data: " + string(b) + "\n\n")
		}
		gd := streamOf(newX(request.Chat))
		var sent []byte
		cut := false
		for _, piece := range []string{`{"q":"KVG`, `-` + bobMarker[4:12], bobMarker[12:] + `"}`} {
			out, ok := gd.event(toolChunk(piece))
			if !ok {
				cut = true
				break
			}
			sent = append(sent, out...)
		}
		if !cut || bytes.Contains(sent, []byte("KVG-")) {
			t.Fatalf("tool-call arguments: cut=%v sent %s", cut, sent)
		}
		gd = streamOf(newX(request.Chat))
		tokens := []any{}
		for _, tok := range []string{"K", "VG-", bobMarker[4:9], bobMarker[9:]} {
			tokens = append(tokens, map[string]any{"token": tok, "logprob": -0.1})
		}
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": "x"}, "logprobs": map[string]any{"content": tokens}}}})
		if out, ok := gd.event([]byte("data: " + string(b) + "\n\n")); ok {
			t.Fatalf("a marker spread over logprob tokens passed: %s", out)
		}
	})
	t.Run("nothing rides behind a JSON value or in a key", func(t *testing.T) {
		gd := streamOf(newX(request.Chat))
		if _, ok := gd.event([]byte(`data: {"choices":[]} ` + bobMarker + "\n\n")); ok {
			t.Fatal("marker after the event's JSON passed")
		}
		x0 := newX(request.Chat)
		for _, b := range []string{`500 internal error ` + bobMarker, `{"a":1}` + "\n" + `{"text":"` + bobMarker + `"}`, `{"top_logprobs":{"` + bobMarker + `":-0.1}}`} {
			if out, ok := bodyOf(x0, []byte(b)); ok {
				t.Fatalf("body %q passed as %q", b, out)
			}
		}
	})
	t.Run("non-streaming bodies", func(t *testing.T) {
		x0 := newX(request.Chat)
		clean := []byte(`{"choices":[{"message":{"content":"hello"}}],"usage":{"prompt_tokens":3}}`)
		if out, ok := bodyOf(x0, clean); !ok || !bytes.Equal(out, clean) {
			t.Fatalf("clean body changed: %s", out)
		}
		own := []byte(`{"choices":[{"message":{"content":"hi ` + aliceMarker + `"}}],"usage":{"prompt_tokens":3}}`)
		if out, ok := bodyOf(x0, own); !ok || bytes.Contains(out, []byte("KVG")) || !bytes.Contains(out, []byte(`"prompt_tokens":3`)) {
			t.Fatalf("own marker not stripped or numbers lost: %s", out)
		}
		if _, ok := bodyOf(x0, []byte(`{"text":"`+bobMarker+`"}`)); ok {
			t.Fatal("foreign marker in a body passed")
		}
		tail := []byte(`{"choices":[{"message":{"content":"ends with KV"}}],"x":"\u0041"}`)
		if out, ok := bodyOf(newX(request.Chat), tail); !ok || !bytes.Contains(out, []byte(`ends with KV"`)) {
			t.Fatalf("a whole body must keep its text intact: %s", out)
		}
	})
}

// A stolen marker put in a tool definition is the requester's own text: an echo, not a leak.
func TestEchoSetCoversToolDefinitions(t *testing.T) {
	g := guardGateway(t)
	bobMarker := markerOf(g, "bob")
	req, e := request.Parse(request.Chat, []byte(`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","description":"`+bobMarker+`"}}]}`))
	if e != nil {
		t.Fatal(e)
	}
	x := watched(&exchange{g: g, tenant: &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}, kind: request.Chat, req: req, rid: "r", route: &backends.Route{}})
	if out, ok := bodyOf(x, []byte(`{"choices":[{"message":{"content":"the tool says `+bobMarker+`"}}]}`)); !ok || bytes.Contains(out, []byte("KVG-")) {
		t.Fatalf("an echo must be stripped, not cut: ok=%v %s", ok, out)
	}
}

func TestGuardKeepsLogprobTokensAndEscapedEchoes(t *testing.T) {
	g := guardGateway(t)
	bobMarker := markerOf(g, "bob")
	alice := &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}
	// Clean logprob tokens are never reshaped, even ones ending in a possible marker start.
	x := watched(&exchange{g: g, tenant: alice, kind: request.Chat, rid: "r", route: &backends.Route{}})
	gd := streamOf(x)
	ev := []byte(`data: {"choices":[{"index":0,"delta":{"content":"OK then"},"logprobs":{"content":[{"token":"OK","top_logprobs":[{"token":"OK"},{"token":"Okay"}]},{"token":" then"}]}}]}` + "\n\n")
	if out, ok := gd.event(ev); !ok || !sameEvent(out, ev) {
		t.Fatalf("clean logprobs changed:\n%s\n%s", ev, out)
	}
	// Completions' top_logprobs keys are tokens too: a marker spread over them is caught.
	gd = streamOf(x)
	var cut bool
	for _, k := range []string{"K", "VG-", bobMarker[4:10], bobMarker[10:]} {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "text": "x", "logprobs": map[string]any{"top_logprobs": []any{map[string]any{k: -0.5}}}}}})
		if _, ok := gd.event([]byte("data: " + string(b) + "\n\n")); !ok {
			cut = true
			break
		}
	}
	if !cut {
		t.Fatal("a marker spread over top_logprobs keys passed")
	}
	// A stolen marker written with JSON escapes in a tool definition is still the requester's own.
	esc := `\u004bVG-` + bobMarker[4:]
	req, e := request.Parse(request.Chat, []byte(`{"messages":[{"role":"user","content":"hi","refusal":null,"annotations":[]}],"tools":[{"type":"function","function":{"name":"f","description":"`+esc+`"}}]}`))
	if e != nil {
		t.Fatalf("empty unknown message fields must be accepted: %v", e)
	}
	x = watched(&exchange{g: g, tenant: alice, kind: request.Chat, req: req, rid: "r", route: &backends.Route{}})
	if out, ok := bodyOf(x, []byte(`{"choices":[{"message":{"content":"the tool says `+bobMarker+`"}}]}`)); !ok || bytes.Contains(out, []byte("KVG-")) {
		t.Fatalf("an escaped stolen marker must be an echo (stripped), not cut: ok=%v %s", ok, out)
	}
	if _, e := request.Parse(request.Chat, []byte(`{"messages":[{"role":"user","content":"hi","documents":["text"]}]}`)); e == nil || e.Param != "messages[0].documents" {
		t.Fatalf("a non-empty unknown message field must be refused: %+v", e)
	}
}

// Opted-out tenants and token-id requests get no marker, and both are counted.
func TestInjectionSkips(t *testing.T) {
	g := guardGateway(t)
	opted := &tenants.Tenant{Tenant: config.Tenant{Name: "bob", CanaryOptOut: true}}
	alice := &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}
	for _, c := range []struct {
		tn     *tenants.Tenant
		kind   request.Kind
		body   string
		marked bool
	}{
		{opted, request.Chat, `{"messages":[{"role":"user","content":"hi"}]}`, false},
		{alice, request.Generate, `{"input_ids":[1,2,3]}`, false},
		{alice, request.Chat, `{"messages":[{"role":"user","content":"hi"}]}`, true},
		{alice, request.Completions, `{"prompt":"hi"}`, true},
	} {
		req, e := request.Parse(c.kind, []byte(c.body))
		if e != nil {
			t.Fatal(e)
		}
		watched(&exchange{g: g, tenant: c.tn, kind: c.kind, req: req, rid: "r"})
		req.Render()
		fields, _ := json.Marshal(req.Fields)
		got := strings.Contains(string(fields), "KVG-") || (len(req.Prompts) > 0 && strings.Contains(req.Prompts[0].Text, "KVG-"))
		if got != c.marked {
			t.Fatalf("%s: marked=%v, want %v: %s", c.body, got, c.marked, fields)
		}
	}
	m := string(mustGather(t, g))
	for _, want := range []string{`kvgate_canary_skipped_total{reason="opt_out"} 1`, `kvgate_canary_skipped_total{reason="input_ids"} 1`, `kvgate_canary_injected_total 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func mustGather(t *testing.T, g *Gateway) []byte {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/metrics")
	ctx.Request.Header.SetMethod("GET")
	ctx.Request.Header.Set("Authorization", "Bearer scrape-key")
	g.Handle(&ctx)
	return ctx.Response.Body()
}

// sameEvent: two single data events carry equal JSON values.
func sameEvent(a, b []byte) bool {
	va, _, ea := reply.DecodeStrict(bytes.TrimSpace(bytes.TrimPrefix(a, []byte("data:"))))
	vb, _, eb := reply.DecodeStrict(bytes.TrimSpace(bytes.TrimPrefix(b, []byte("data:"))))
	return ea == nil && eb == nil && string(reply.CanonicalJSON(va)) == string(reply.CanonicalJSON(vb))
}

// markerOf is tenant's current marker under g's canary settings (the keyring's public rule).
func markerOf(g *Gateway, tenant string) string {
	c := g.cfg.Canary
	m, _ := canary.NewKeyring([]byte(c.Secret), c.Epoch, c.DetectWindow, []string{tenant}).Current(tenant, time.Now())
	return m
}

// watched opens x's leak watch as admit does (the marker injected into x.req, when it has one),
// and tells it the route as forward does.
func watched(x *exchange) *exchange {
	x.watch = x.g.watch.Begin(x.rid, x.engineRID, x.tenant, x.kind, x.req)
	x.watch.Forwarding(x.route, nil)
	return x
}
