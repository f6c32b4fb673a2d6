package gateway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// badInput is one malformed request of the table. status 0 means "any 4xx".
type badInput struct {
	name   string
	req    rawReq
	status int
	code   string
}

var chatMsg = `"messages":[{"role":"user","content":"hi"}]`

func chat(fields string) rawReq {
	return rawReq{path: "/v1/chat/completions", body: []byte("{" + chatMsg + fields + "}")}
}
func compl(body string) rawReq { return rawReq{path: "/v1/completions", body: []byte(body)} }
func gen(body string) rawReq   { return rawReq{path: "/generate", body: []byte(body)} }

func deep(open, close string, n int) string {
	return strings.Repeat(open, n) + strings.Repeat(close, n)
}

func badInputs() []badInput {
	tenMB := strings.Repeat("abcdefgh ", 10<<20/9)
	chunked := func(path, chunks string) rawReq {
		return rawReq{path: path, headers: [][2]string{{"Transfer-Encoding", "chunked"}}, body: []byte(chunks)}
	}
	cases := []badInput{
		// Truncated and invalid JSON.
		{name: "empty body", req: rawReq{path: "/v1/chat/completions"}, status: 400},
		{name: "lone brace", req: compl(`{`), status: 400},
		{name: "truncated object", req: compl(`{"prompt":"x","max_tokens":1`), status: 400},
		{name: "unterminated string", req: compl(`{"prompt":"abc`), status: 400},
		{name: "two objects", req: compl(`{"prompt":"x"} {"prompt":"y"}`), status: 400},
		{name: "trailing comma", req: compl(`{"prompt":"x",}`), status: 400},
		{name: "single quotes", req: compl(`{'prompt':'x'}`), status: 400},
		{name: "NaN", req: compl(`{"prompt":"x","temperature":NaN}`), status: 400},
		{name: "comment", req: compl(`{"prompt":"x" /* hi */}`), status: 400},
		{name: "bare string", req: gen(`"hello"`), status: 400},
		{name: "null", req: gen(`null`), status: 400},
		{name: "number", req: gen(`42`), status: 400},
		{name: "array of requests", req: compl(`[{"prompt":"x"}]`), status: 400},
		{name: "byte order mark", req: compl("\xef\xbb\xbf{\"prompt\":\"x\"}"), status: 400},
		{name: "unquoted key", req: compl(`{prompt:"x"}`), status: 400},
		{name: "bad escape", req: compl(`{"prompt":"\q"}`), status: 400},
		{name: "truncated unicode escape", req: compl(`{"prompt":"\u12"}`), status: 400},
		// Wrong types.
		{name: "messages string", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":"hi"}`)}, status: 400},
		{name: "messages object", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":{"role":"user"}}`)}, status: 400},
		{name: "role number", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":1,"content":"x"}]}`)}, status: 400},
		{name: "content number", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":"user","content":7}]}`)}, status: 400},
		{name: "text part without text", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`)}, status: 400},
		{name: "unknown part type", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":"user","content":[{"type":"blob","text":"x"}]}]}`)}, status: 400},
		{name: "name number", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":"user","content":"x","name":5}]}`)}, status: 400},
		{name: "prompt number", req: compl(`{"prompt":5}`), status: 400},
		{name: "prompt mixed list", req: compl(`{"prompt":["a",1]}`), status: 400},
		{name: "prompt empty list", req: compl(`{"prompt":[]}`), status: 400},
		{name: "prompt object", req: compl(`{"prompt":{"text":"x"}}`), status: 400},
		{name: "max_tokens string", req: chat(`,"max_tokens":"10"`), status: 400},
		{name: "max_tokens float", req: chat(`,"max_tokens":1.5`), status: 400},
		{name: "max_tokens bool", req: compl(`{"prompt":"x","max_tokens":true}`), status: 400},
		{name: "stream string", req: chat(`,"stream":"yes"`), status: 400},
		{name: "model number", req: chat(`,"model":5`), status: 400},
		{name: "n zero", req: chat(`,"n":0`), status: 400},
		{name: "text number", req: gen(`{"text":5}`), status: 400},
		{name: "sampling_params string", req: gen(`{"text":"x","sampling_params":"fast"}`), status: 400},
		{name: "sampling_params n zero", req: gen(`{"text":"x","sampling_params":{"n":0}}`), status: 400},
		{name: "input_ids strings", req: gen(`{"input_ids":["a","b"]}`), status: 400},
		{name: "input_ids mixed batch", req: gen(`{"input_ids":[[1],"a"]}`), status: 400},
		{name: "suffix number", req: compl(`{"prompt":"x","suffix":1}`), status: 400},
		// Huge and negative numbers.
		{name: "max_tokens 1e400", req: chat(`,"max_tokens":1e400`), status: 400},
		{name: "max_tokens 10^23", req: chat(`,"max_tokens":99999999999999999999999`), status: 400},
		{name: "max_tokens 2^31", req: compl(`{"prompt":"x","max_tokens":2147483648}`), status: 400},
		{name: "n 2^32+1", req: chat(`,"n":4294967297`), status: 400},
		{name: "negative max_tokens", req: chat(`,"max_tokens":-1`), status: 400},
		{name: "negative max_completion_tokens", req: chat(`,"max_completion_tokens":-100`), status: 400},
		{name: "negative completions max_tokens", req: compl(`{"prompt":"x","max_tokens":-5}`), status: 400},
		{name: "negative max_new_tokens", req: gen(`{"text":"x","sampling_params":{"max_new_tokens":-1}}`), status: 400},
		{name: "huge max_new_tokens", req: gen(`{"text":"x","sampling_params":{"max_new_tokens":1e30}}`), status: 400},
		{name: "max_tokens over the context", req: compl(`{"prompt":"x","max_tokens":1000000}`), status: 413, code: "context_length_exceeded"},
		// Invalid UTF-8.
		{name: "invalid utf-8 in prompt", req: compl("{\"prompt\":\"\xff\xfe\"}"), status: 400},
		{name: "overlong utf-8", req: compl("{\"prompt\":\"\xc0\xaf\"}"), status: 400},
		{name: "lone continuation byte", req: gen("{\"text\":\"a\x80b\"}"), status: 400},
		{name: "utf-8 encoded surrogate", req: chat(",\"user\":\"\xed\xa0\x80\""), status: 400},
		{name: "invalid utf-8 in a key", req: compl("{\"prompt\":\"x\",\"\xff\":1}"), status: 400},
		{name: "latin-1 body", req: compl("{\"prompt\":\"caf\xe9\"}"), status: 400},
		// NUL bytes.
		{name: "raw NUL in a string", req: compl("{\"prompt\":\"a\x00b\"}"), status: 400},
		{name: "raw NUL after the object", req: compl("{\"prompt\":\"x\"}\x00"), status: 400},
		{name: "raw NUL in a key", req: compl("{\"pro\x00mpt\":\"x\"}"), status: 400},
		{name: "NUL in a header value", req: rawReq{path: "/v1/completions", headers: [][2]string{{"X-Note", "a\x00b"}}, body: []byte(`{"prompt":"x"}`)}},
		// 10 MB strings (the body limit is 12 MiB here, so the parser and the counter see them).
		{name: "10 MB prompt", req: compl(`{"prompt":"` + tenMB + `","max_tokens":1}`), status: 413, code: "context_length_exceeded"},
		{name: "10 MB chat content", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":"user","content":"` + tenMB + `"}]}`)}, status: 413, code: "context_length_exceeded"},
		{name: "10 MB generate text", req: gen(`{"text":"` + tenMB + `"}`), status: 413, code: "context_length_exceeded"},
		{name: "10 MB unterminated string", req: compl(`{"prompt":"` + tenMB), status: 400},
		{name: "10 MB unknown key", req: compl(`{"prompt":"x","` + strings.Repeat("k", 10<<20) + `":1}`), status: 400},
		{name: "10 MB token ids", req: gen(`{"input_ids":[` + strings.TrimSuffix(strings.Repeat("1,", 5<<20), ",") + `]}`), status: 413, code: "context_length_exceeded"},
		// Deep nesting.
		{name: "deep unterminated arrays", req: chat(`,"metadata":` + strings.Repeat("[", 100000)), status: 400},
		{name: "deep objects in metadata", req: chat(`,"metadata":` + deep(`{"a":`, `}`, 100000)), status: 400},
		{name: "deep arrays in content", req: rawReq{path: "/v1/chat/completions", body: []byte(`{"messages":[{"role":"user","content":` + deep("[", "]", 50000) + `}]}`)}, status: 400},
		{name: "deep arrays as prompt", req: compl(`{"prompt":` + deep("[", "]", 50000) + `}`), status: 400},
		// Duplicate and case-variant keys.
		{name: "duplicate prompt", req: compl(`{"prompt":"x","prompt":"` + words(20000) + `"}`), status: 400},
		{name: "duplicate messages", req: rawReq{path: "/v1/chat/completions", body: []byte(`{` + chatMsg + `,` + chatMsg + `}`)}, status: 400},
		{name: "duplicate stream", req: chat(`,"stream":false,"stream":true`), status: 400},
		{name: "duplicate max_new_tokens", req: gen(`{"text":"x","sampling_params":{"max_new_tokens":1,"max_new_tokens":100000}}`), status: 400},
		{name: "case-variant Prompt", req: compl(`{"Prompt":"x"}`), status: 400},
		{name: "case-variant RID", req: gen(`{"text":"x","RID":"other"}`), status: 400},
		// Engine-control fields and unknown fields.
		{name: "bootstrap_port", req: gen(`{"text":"x","bootstrap_port":8998}`), status: 400},
		{name: "session_params", req: chat(`,"session_params":{"id":"s"}`), status: 400},
		{name: "return_hidden_states", req: gen(`{"text":"x","return_hidden_states":true}`), status: 400},
		{name: "audio_data", req: gen(`{"text":"x","audio_data":"AAAA"}`), status: 400},
		// Wrong content types (the body decides: anything that is not one JSON object is refused).
		{name: "form body", req: rawReq{path: "/v1/completions", headers: [][2]string{{"Content-Type", "application/x-www-form-urlencoded"}}, body: []byte("prompt=hi&max_tokens=5")}, status: 400},
		{name: "multipart body", req: rawReq{path: "/v1/completions", headers: [][2]string{{"Content-Type", "multipart/form-data; boundary=X"}},
			body: []byte("--X\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n--X--\r\n")}, status: 400},
		{name: "text/plain prose", req: rawReq{path: "/generate", headers: [][2]string{{"Content-Type", "text/plain"}}, body: []byte("tell me a story")}, status: 400},
		{name: "gzip body", req: rawReq{path: "/generate", headers: [][2]string{{"Content-Encoding", "gzip"}}, body: gz(`{"text":"x"}`)}, status: 400},
		// Chunked bodies.
		{name: "chunked bad size", req: chunked("/v1/completions", "zz\r\n{}\r\n0\r\n\r\n")},
		{name: "chunked size too short", req: chunked("/v1/completions", "2\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")},
		{name: "chunked invalid json", req: chunked("/v1/completions", "5\r\n{\"pro\r\n0\r\n\r\n"), status: 400},
		{name: "chunked negative size", req: chunked("/v1/completions", "-5\r\nhello\r\n0\r\n\r\n")},
		{name: "chunked over the limit", req: chunked("/generate", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", 13<<20, strings.Repeat("a", 13<<20))), status: 413, code: "request_too_large"},
		// Bodies over the limit.
		{name: "declared length over the limit", req: rawReq{path: "/generate", headers: [][2]string{{"Content-Length", fmt.Sprint(100 << 20)}}, body: []byte(`{"text":"` + strings.Repeat("a", 64<<10))}, status: 413, code: "request_too_large"},
		{name: "body over the limit", req: gen(`{"text":"` + strings.Repeat("a", 13<<20) + `"}`), status: 413, code: "request_too_large"},
		// Unknown routes and methods (none is proxied).
		{name: "embeddings without input", req: rawReq{path: "/v1/embeddings", body: []byte(`{"model":"sim"}`)}, status: 400},
		{name: "engine flush_cache", req: rawReq{path: "/flush_cache", body: []byte(`{}`)}, status: 404},
		{name: "v2 chat", req: rawReq{path: "/v2/chat/completions", body: []byte("{" + chatMsg + "}")}, status: 404},
		{name: "trailing slash", req: rawReq{path: "/generate/", body: []byte(`{"text":"x"}`)}, status: 404},
		{name: "upper-case path", req: rawReq{path: "/V1/COMPLETIONS", body: []byte(`{"prompt":"x"}`)}, status: 404},
		{name: "engine abort route", req: rawReq{path: "/abort_request", body: []byte(`{"rid":"x"}`)}, status: 404},
		{name: "engine server_info", req: rawReq{method: "GET", path: "/server_info"}, status: 404},
		{name: "tokenize with an engine field", req: rawReq{path: "/tokenize", body: []byte(`{"prompt":"x","rid":"r"}`)}, status: 400},
		{name: "engine update_weights", req: rawReq{path: "/update_weights_from_disk", body: []byte(`{"model_path":"/tmp"}`)}, status: 404},
		{name: "sim stats", req: rawReq{method: "GET", path: "/sim/stats"}, status: 404},
		{name: "dot-dot to admin", req: rawReq{method: "GET", path: "/v1/../admin/backends"}, status: 401},
		{name: "GET generate", req: rawReq{method: "GET", path: "/generate"}, status: 405},
		{name: "PUT completions", req: rawReq{method: "PUT", path: "/v1/completions", body: []byte(`{"prompt":"x"}`)}, status: 405},
		// Credentials.
		{name: "no key", req: rawReq{path: "/generate", noAuth: true, body: []byte(`{"text":"x"}`)}, status: 401},
		{name: "wrong key", req: rawReq{path: "/generate", key: "sk-nope", body: []byte(`{"text":"x"}`)}, status: 401},
		{name: "basic auth", req: rawReq{path: "/generate", noAuth: true, headers: [][2]string{{"Authorization", "Basic YWxpY2U6eA=="}}, body: []byte(`{"text":"x"}`)}, status: 401},
		{name: "key with a suffix", req: rawReq{path: "/generate", key: tenantKey + "x", body: []byte(`{"text":"x"}`)}, status: 401},
		{name: "key as x-api-key", req: rawReq{path: "/generate", noAuth: true, headers: [][2]string{{"X-Api-Key", tenantKey}}, body: []byte(`{"text":"x"}`)}, status: 401},
	}
	return cases
}

// TestBadInputTable sends every malformed request of the table to an in-process gateway in front
// of a real simulator process: each gets a 4xx in OpenAI's envelope, none reaches the engine
// (/sim/stats), and a normal request still succeeds afterwards.
func TestBadInputTable(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	// A 10 MB body keeps both cores busy for a while: the capacity reading must not age out
	// meanwhile (this test is about bad input, not about stale capacity).
	yaml := strings.Replace(gatewayYAML("max_body_bytes: 12582912\n", [3]string{"sim", sim.URL, "unified"}),
		"capacity: {poll_interval: 200ms}", "capacity: {poll_interval: 200ms, max_age: 30s}", 1)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	cases := badInputs()
	if len(cases) < 50 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := sim.Stats(t)
			defer func() {
				after := sim.Stats(t)
				for route, n := range after.Requests {
					if n != before.Requests[route] {
						t.Errorf("a refused request reached the engine: %v → %v", before.Requests, after.Requests)
					}
				}
			}()
			r := sendRaw(t, gw.Addr, c.req.bytes(), 20*time.Second)
			if r.resp == nil {
				t.Fatalf("no response: %v", r.err)
			}
			st := r.resp.StatusCode
			bad := ""
			switch {
			case st < 400 || st > 499:
				bad = fmt.Sprintf("want a 4xx, got %d %.200s", st, r.body)
			case c.status != 0 && st != c.status:
				bad = fmt.Sprintf("want %d, got %d %.200s", c.status, st, r.body)
			}
			if bad != "" {
				t.Fatal(bad)
			}
			if ct := r.resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Fatalf("content type %q", ct)
			}
			var e errorBody
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Message == "" || e.Error.Code == "" || e.Error.Type == "" {
				t.Fatalf("not an OpenAI error envelope: %.300s", r.body)
			}
			if c.code != "" && e.Error.Code != c.code {
				t.Fatalf("want code %s, got %s", c.code, r.body)
			}
			if strings.Contains(string(r.body), tenantKey) || strings.Contains(string(r.body), sim.Addr) {
				t.Fatalf("the error echoes a key or a backend address: %s", r.body)
			}
		})
	}
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"still fine","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("gateway unhealthy after the table: %d %s", r.status, r.body)
	}
	if r := get(t, gw.URL+"/healthz", ""); r.status != 200 {
		t.Fatalf("healthz %d", r.status)
	}
}
