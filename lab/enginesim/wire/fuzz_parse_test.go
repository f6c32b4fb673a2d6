package wire

import (
	"strconv"
	"testing"
)

// fuzzEnv numbers request ids as a server does and drops the salts.
func fuzzEnv() Env {
	n := 0
	return Env{NewRID: func() string { n++; return "sim-0-" + strconv.Itoa(n) }, NoteSalts: func([]string) {}}
}

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
	env := fuzzEnv()
	f.Fuzz(func(t *testing.T, body []byte) {
		items, _, _, err := ParseGenerate(env, body)
		if err != nil {
			return
		}
		if len(items) == 0 {
			t.Fatalf("accepted %q with no items", body)
		}
		for _, it := range items {
			if it.RID == "" || it.MaxNew < 0 {
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
	env := fuzzEnv()
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		r := RouteCompletions
		if chat {
			r = RouteChat
		}
		req, items, promptOf, err := ParseOpenAI(env, r, body)
		if err != nil {
			return
		}
		if req == nil || len(items) == 0 || len(items) != len(promptOf) {
			t.Fatalf("accepted %q: %d items, %d prompt indexes", body, len(items), len(promptOf))
		}
	})
}
