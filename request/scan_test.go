package request

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// parseSeeds are bodies for the fast/decoder comparison: every shape the routes read, and
// malformed ones.
var parseSeeds = []string{
	`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one word."}],"max_tokens":8}`,
	`{"messages":[{"role":"user","content":"hi"}]}`,
	` { "messages" : [ null , {"role":"user","content":"x"} ] , "stream" : true } `,
	`{"messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"user","content":null}],"tools":[{"type":"function"}]}`,
	`{"messages":[{"role":"user","content":"a\u0000b\"c\\","name":"n\u00e9"}],"max_completion_tokens":0,"n":3,"stream":false}`,
	`{"messages":[{"role":"user","content":"x","refusal":null,"annotations":[]}],"model":null,"stream":null}`,
	`{"messages":[{"role":"user","content":"x","extra":1}]}`,
	`{"messages":[{"role":1,"content":"x"}]}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":1.0}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":1e3}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":"5"}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":1073741825}`,
	`{"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999999999999}`,
	`{"messages":[{"role":"user","content":"x"}],"stream":"true"}`,
	`{"messages":[{"role":"user","content":"x"}],"model":5}`,
	`{"messages":"x"}`, `{"messages":[]}`, `{"messages":null}`, `{"messages":[1]}`, `{"messages":[[]]}`,
	`{"\u006dessages":[{"r\u006fle":"user","content":"x"}]}`,
	`{"messages":[{"role":"user","content":"x"}]} {}`, `{"messages":[{"role":"user","content":"x"}]`,
	`{"messages":[{"role":"user","content":"x"}],"rid":"y"}`, `{"messages":[{"role":"user","content":"x"}],"Model":"y"}`,
	`{"prompt":["a","b"],"max_tokens":3,"n":2}`, `{"prompt":[[1,2],[3]]}`, `{"prompt":"p","suffix":"s","best_of":2}`,
	`{"text":"x","sampling_params":{"max_new_tokens":5,"n":2}}`, `{"input_ids":[1,2,3]}`, `{"text":"x","rid":"y"}`,
	"{\"text\":\"\xff\"}", `[]`, `null`, `{}`, `{"messages":[{}]}`, ``, `"x"`, `{"a":}`,
	`{"messages":[{"role":"user","content":"tab	inside"}]}`,
}

// The request's own scanner reads every body as the JSON library's decoder does: the same
// error (status, field, message) or the same request (fields byte for byte, messages, texts,
// output, prompts).
func TestFastParseEqualsDecoder(t *testing.T) {
	bodies := append([]string(nil), parseSeeds...)
	files, _ := filepath.Glob("testdata/fuzz/FuzzParseRequest/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// go test fuzz v1 / string("...")
		for _, line := range strings.Split(string(b), "\n") {
			if s, ok := strings.CutPrefix(line, "string("); ok {
				if u, err := strconv.Unquote(strings.TrimSuffix(s, ")")); err == nil {
					bodies = append(bodies, u)
				}
			}
		}
	}
	for _, body := range bodies {
		sameParse(t, body)
	}
}

func FuzzFastParse(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) { sameParse(t, body) })
}

func sameParse(t *testing.T, body string) {
	t.Helper()
	for _, kind := range []Kind{Chat, Completions, Generate, Responses, Messages, Embeddings} {
		a, ea := parse(kind, []byte(body), true)
		b, eb := parse(kind, []byte(body), false)
		if (ea == nil) != (eb == nil) {
			t.Fatalf("kind %d %q: fast %+v, decoder %+v", kind, body, ea, eb)
		}
		if ea != nil {
			// The decoder's own words may differ only where the body is not a JSON object at all.
			if ea.Status != eb.Status || ea.Param != eb.Param || ea.Code != eb.Code || ea.Message != eb.Message {
				t.Fatalf("kind %d %q: fast %+v, decoder %+v", kind, body, ea, eb)
			}
			continue
		}
		if len(a.Fields) != len(b.Fields) {
			t.Fatalf("%q: fields %v vs %v", body, a.Fields, b.Fields)
		}
		for k, v := range b.Fields {
			if !bytes.Equal(a.Fields[k], v) {
				t.Fatalf("%q: field %s: %q vs %q", body, k, a.Fields[k], v)
			}
		}
		if len(a.messages) != len(b.messages) {
			t.Fatalf("%q: %d vs %d messages", body, len(a.messages), len(b.messages))
		}
		for i := range b.messages {
			if (a.messages[i] == nil) != (b.messages[i] == nil) || len(a.messages[i]) != len(b.messages[i]) {
				t.Fatalf("%q: message %d: %v vs %v", body, i, a.messages[i], b.messages[i])
			}
			for k, v := range b.messages[i] {
				if !bytes.Equal(a.messages[i][k], v) {
					t.Fatalf("%q: message %d.%s: %q vs %q", body, i, k, a.messages[i][k], v)
				}
			}
		}
		a.fast, a.messages, a.Fields = false, nil, nil
		b.messages, b.Fields = nil, nil
		a.Render()
		b.Render()
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%q:\n fast    %+v\n decoder %+v", body, a, b)
		}
	}
}
