package enginesim

import (
	"testing"

	"github.com/valyala/fasthttp"
)

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
