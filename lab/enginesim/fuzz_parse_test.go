package enginesim

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// The request parsers take bytes straight from clients: they must refuse or
// accept, never panic, and an accepted request always has a prompt per item.
func FuzzParseGenerate(f *testing.F) {
	for _, seed := range []string{
		`{"text":"hello","sampling_params":{"max_new_tokens":4}}`,
		`{"text":["a","b"],"rid":["x","y"],"sampling_params":[{"max_new_tokens":1},{}]}`,
		`{"input_ids":[[1,2],[3]],"bootstrap_host":["127.0.0.1","::1"],"bootstrap_port":[null,8998],"bootstrap_room":[1,2]}`,
		`{"text":"x","bootstrap_host":"localhost","bootstrap_port":null,"bootstrap_room":9223372036854775807}`,
		`{"text":null,"input_ids":null}`, `[]`, `{"text":5}`, `{"sampling_params":{"max_new_tokens":-1},"text":"a"}`,
	} {
		f.Add([]byte(seed))
	}
	s, err := New(Config{Tokenizer: "chunk4", PoolTokens: 1024, PageSize: 16, ContextLength: 2048})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		items, _, _, err := s.parseGenerate(body)
		if err != nil {
			return
		}
		if len(items) == 0 {
			t.Fatalf("accepted %q with no items", body)
		}
		for _, it := range items {
			if it.rid == "" || it.maxNew < 0 {
				t.Fatalf("bad item %+v from %q", it, body)
			}
		}
	})
}

func FuzzParseOpenAI(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"n":2}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`,
		`{"prompt":["a","b"],"max_completion_tokens":1}`, `{"prompt":[[1,2,3]]}`, `{"prompt":[1,2]}`,
		`{"messages":[]}`, `{"n":0,"prompt":"x"}`,
	} {
		f.Add([]byte(seed), true)
		f.Add([]byte(seed), false)
	}
	s, err := New(Config{Tokenizer: "chunk4", PoolTokens: 1024, PageSize: 16, ContextLength: 2048})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		r := routeCompletions
		if chat {
			r = routeChat
		}
		req, items, promptOf, err := s.parseOpenAI(r, body)
		if err != nil {
			return
		}
		if req == nil || len(items) == 0 || len(items) != len(promptOf) {
			t.Fatalf("accepted %q: %d items, %d prompt indexes", body, len(items), len(promptOf))
		}
	})
}

// The newer routes parse inside their handlers: every one of them, fed any
// body, must answer (2xx or 4xx) without panicking and without keeping pages.
func FuzzRouteBodies(f *testing.F) {
	paths := []string{"/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/embeddings", "/v1/rerank",
		"/v1/score", "/v1/classify", "/encode", "/classify", "/detokenize", "/v1/tokenize"}
	for _, seed := range []string{
		`{"input":"hi","instructions":"x","max_output_tokens":2}`, `{"input":"hi","stream":true}`,
		`{"max_tokens":3,"stream":true,"messages":[{"role":"user","content":"a b"}]}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call"}]}`,
		`{"input":"x","previous_response_id":"resp_none"}`,
		`{"max_tokens":2,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"messages":[{"role":"tool","content":"a"}],"max_tokens":0}`,
		`{"input":[[1,2],[3]],"cache_salt":["a","b"]}`, `{"input":[]}`, `{"text":"a","input_ids":[1]}`,
		`{"query":"q","documents":["a",""],"top_n":0}`, `{"query":[1,2],"items":[[3],[4]],"label_token_ids":[1,2],"apply_softmax":true}`,
		`{"query":"q","items":"i","item_first":true}`, `{"tokens":[[1],[2,3]]}`, `{"tokens":"x"}`, `{"prompt":["a"]}`, `null`, `[`,
	} {
		for i := range paths {
			f.Add([]byte(seed), uint8(i))
		}
	}
	s, err := New(Config{Tokenizer: "chunk4", PoolTokens: 1024, PageSize: 16, ContextLength: 2048})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body []byte, pi uint8) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(paths[int(pi)%len(paths)])
		ctx.Request.SetBody(body)
		h(&ctx)
		// Body reads a stream to its end, which releases the stream's pages.
		out := ctx.Response.Body()
		if c := ctx.Response.StatusCode(); c >= 500 {
			t.Fatalf("%s %q: %d %s", paths[int(pi)%len(paths)], body, c, out)
		}
		if st := s.Stats(); st.Pool.PagesFree != st.Pool.PagesTotal {
			t.Fatalf("%q kept pages: %+v", body, st.Pool)
		}
	})
}
