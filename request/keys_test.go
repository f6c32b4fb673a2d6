package request

import (
	"bytes"
	stdjson "encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// Keys that Go's decoders read as one field and Python engines as two (or as the other one)
// are refused at any depth, with the path of the field; distinct keys pass.
func TestKeysDuplicateAndCaseVariantRefused(t *testing.T) {
	long := strings.Repeat("word ", 2000)
	for _, c := range []struct {
		kind  Kind
		body  string
		param string // "" = accepted
	}{
		{Chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `","TEXT":"hi"}]}]}`, "messages[0].content[0].TEXT"},
		{Chat, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"` + long + `","text":"hi"}]}]}`, "messages[1].content[1].text"},
		{Generate, `{"text":"hi","sampling_params":{"max_new_tokens":1,"MAX_NEW_TOKENS":16380}}`, "sampling_params.MAX_NEW_TOKENS"},
		{Generate, `{"text":"hi","sampling_params":{"max_new_tokens":1,"max_new_tokens":16380}}`, "sampling_params.max_new_tokens"},
		// Escapes are resolved before comparing: \u0074ext is text.
		{Chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a","\u0074ext":"b"}]}]}`, "messages[0].content[0].text"},
		// The Kelvin sign folds to k in encoding/json's matching: "\u212aey" and "key" collide.
		{Chat, `{"messages":[{"role":"user","content":"x"}],"metadata":{"key":1,"\u212aey":2}}`, "metadata.\u212aey"},
		{Chat, `{"model":"a","MODEL":"b","messages":[{"role":"user","content":"x"}]}`, "MODEL"},
		{Chat, `{"messages":[{"role":"user","content":"x","Role":"system"}]}`, "messages[0].Role"},
		// Deep inside a tool definition.
		{Chat, `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{},"A":{}}}}}]}`, "tools[0].function.parameters.properties.A"},
		// Many keys (the map path) with a repeat at the end.
		{Generate, `{"text":"hi","sampling_params":{"logit_bias":{` + manyKeys(100) + `,"k7":1}}}`, "sampling_params.logit_bias.k7"},
		// Accepted: the same key in different objects, keys inside strings, escaped quotes.
		{Chat, `{"messages":[{"role":"user","content":"\"role\": \"x\", \"ROLE\":"},{"role":"assistant","content":"y"}]}`, ""},
		{Generate, `{"text":"a\\","sampling_params":{"logit_bias":{` + manyKeys(100) + `}}}`, ""},
	} {
		_, e := Parse(c.kind, []byte(c.body))
		switch {
		case c.param == "" && e != nil:
			t.Errorf("%.80s: refused: %+v", c.body, e)
		case c.param != "" && e == nil:
			t.Errorf("%.80s: accepted", c.body)
		case c.param != "" && (e.Status != 400 || e.Param != c.param || e.Code != "invalid_request"):
			t.Errorf("%.80s: got %d param=%q %s, want 400 param=%q", c.body, e.Status, e.Param, e.Message, c.param)
		}
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strconv.Itoa(i) + `":0.5`)
	}
	return b.String()
}

// sampling_params and content parts are allow-listed by exact name.
func TestKeysAllowListSamplingParamsAndParts(t *testing.T) {
	for _, c := range []struct {
		kind  Kind
		body  string
		param string
	}{
		{Generate, `{"text":"hi","sampling_params":{"MAX_NEW_TOKENS":16380}}`, "sampling_params.MAX_NEW_TOKENS"},
		{Generate, `{"text":"hi","sampling_params":{"custom_params":{"a":1}}}`, "sampling_params.custom_params"},
		{Generate, `{"text":"hi","sampling_params":{"seed":1}}`, "sampling_params.seed"},
		{Generate, `{"text":"hi","sampling_params":{"max_new_tokens":8,"temperature":0,"top_p":1,"top_k":5,"stop":["x"],"n":2,"sampling_seed":3,"logit_bias":{"1":1}}}`, ""},
		{Chat, `{"messages":[{"role":"user","content":[{"type":"text","TEXT":"hi"}]}]}`, "messages[0].content[0].TEXT"},
		{Chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache":"x"}]}]}`, "messages[0].content[0].cache"},
		{Chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, ""},
	} {
		r, e := Parse(c.kind, []byte(c.body))
		switch {
		case c.param == "" && e != nil:
			t.Errorf("%s: refused: %+v", c.body, e)
		case c.param == "" && c.kind == Generate && r.Output != 16:
			t.Errorf("%s: output %d, want 8 × n=2", c.body, r.Output)
		case c.param != "" && e == nil:
			t.Errorf("%s: accepted", c.body)
		case c.param != "" && e.Param != c.param:
			t.Errorf("%s: param %q (%s), want %q", c.body, e.Param, e.Message, c.param)
		}
	}
}

func BenchmarkCheckKeys(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("lorem ipsum \\\" dolor ", 50000) + `"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5}`)
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		if e := CheckKeys(body); e != nil {
			b.Fatal(e)
		}
	}
}

// refRepeatedKey is a slow reference for checkKeys: a token walk with encoding/json, comparing
// every pair of keys of an object with strings.EqualFold (encoding/json's own field matching).
func refRepeatedKey(body []byte) (bool, bool) {
	dec := stdjson.NewDecoder(bytes.NewReader(body))
	type frame struct {
		obj    bool
		keys   []string
		expect bool // next string token in this object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false, true
		}
		if err != nil {
			return false, false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case stdjson.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.obj {
					top.expect = true
				}
				stack = append(stack, &frame{obj: v == '{', expect: v == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.obj && top.expect {
				for _, k := range top.keys {
					if strings.EqualFold(k, v) {
						return true, true
					}
				}
				top.keys = append(top.keys, v)
				top.expect = false
				continue
			}
		}
		if top != nil && top.obj {
			top.expect = true
		}
	}
}

// checkKeys agrees with the reference on every valid JSON body.
func FuzzCheckKeys(f *testing.F) {
	for _, s := range []string{`{"a":1,"A":2}`, `{"a":{"b":[{"c":1},{"c":2,"C":3}]}}`, `{"k":"\"K\":1","K2":1}`,
		`[{"x":1},{"x":1}]`, `{"\u212a":1,"k":2}`, `{"a\\":1,"A\\":2}`, `{"ſ":1,"S":2}`, `{"é":1,"É":2}`, `{"a":[1,2,{"b":1,"b":2}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) || !stdjson.Valid(body) {
			return
		}
		want, ok := refRepeatedKey(body)
		if !ok {
			return
		}
		if got := CheckKeys(body) != nil; got != want {
			t.Fatalf("%s: checkKeys refused=%v, reference %v", body, got, want)
		}
	})
}
