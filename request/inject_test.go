package request

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// The spliced chat injection (the marker written into the body's bytes) gives the request the
// general path (decode, insert, encode) gives it: the same messages as the engine will decode
// them, the same texts to count and render, the same own text.
func TestSpliceChatEqualsGeneralInjection(t *testing.T) {
	const marker = "KVG-abcdefghijklmnopqrst"
	for _, body := range []string{
		`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello."}]}`,
		`{"messages":[{"role":"user","content":"Say \"hello\" \u00e9\n"}],"max_tokens":8}`,
		`{"messages":[{"role":"developer","content":""},{"role":"user","content":"x"}]}`,
		`{"messages" : [ {"content" : "sys\\", "role" : "system" , "name":"n"} , {"role":"user","content":"x"} ] }`,
		`{"messages":[{"role":"user","content":"a","name":"bob"},{"role":"system","content":"late system","tool_call_id":null}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"parts"}]},{"role":"assistant","content":"ok","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"parts"}]},{"role":"user","content":"x"}]}`,
		`{"messages":[{"role":"system","content":null},{"role":"user","content":"x"}]}`,
	} {
		for _, prefix := range []bool{false, true} {
			a, e := Parse(Chat, []byte(body))
			if e != nil {
				t.Fatalf("%s: %+v", body, e)
			}
			b, _ := Parse(Chat, []byte(body))
			if !a.Inject(marker, 0, prefix) {
				t.Fatalf("%s: not injected", body)
			}
			b.injectChat(marker, 0, prefix)
			var ma, mb []map[string]any
			if err := json.Unmarshal(a.Fields["messages"], &ma); err != nil {
				t.Fatalf("%s: spliced messages are not JSON: %v\n%s", body, err, a.Fields["messages"])
			}
			_ = json.Unmarshal(b.Fields["messages"], &mb)
			if !reflect.DeepEqual(ma, mb) {
				t.Errorf("%s prefix=%v:\n spliced %s\n general %s", body, prefix, a.Fields["messages"], b.Fields["messages"])
			}
			if e := CheckKeys(a.Fields["messages"]); e != nil {
				t.Errorf("%s: %+v", body, e)
			}
			for i := range a.messages {
				var x, y any
				_ = json.Unmarshal(a.messages[i]["content"], &x)
				_ = json.Unmarshal(b.messages[i]["content"], &y)
				if !reflect.DeepEqual(x, y) || len(a.messages[i]) != len(b.messages[i]) {
					t.Errorf("%s prefix=%v: message %d: %v vs %v", body, prefix, i, a.messages[i], b.messages[i])
				}
			}
			if !reflect.DeepEqual(a.msgText, b.msgText) || !reflect.DeepEqual(a.contents, b.contents) ||
				!reflect.DeepEqual(a.roles, b.roles) || !reflect.DeepEqual(a.names, b.names) {
				t.Errorf("%s prefix=%v: texts differ:\n %q %q %q\n %q %q %q", body, prefix, a.msgText, a.contents, a.roles, b.msgText, b.contents, b.roles)
			}
			a.Render()
			b.Render()
			if !reflect.DeepEqual(a.Prompts, b.Prompts) || lines(a.OwnText()) != lines(b.OwnText()) {
				t.Errorf("%s prefix=%v: rendered %+v vs %+v", body, prefix, a.Prompts, b.Prompts)
			}
		}
	}
}

// lines sorts s's lines: OwnText walks JSON objects in map order.
func lines(s string) string {
	l := strings.Split(s, "\n")
	slices.Sort(l)
	return strings.Join(l, "\n")
}

// every_bytes repeats the marker through a chat message's text parts as through a string
// content (issue 37: parts got the system marker only), and the texts to count and render carry
// the repetitions the engine gets.
func TestInjectEveryReachesChatTextParts(t *testing.T) {
	const marker = "KVG-abcdefghijklmnopqrst"
	text := strings.Repeat("word ", 40) // 200 bytes: three repetitions at 48
	for _, c := range []struct {
		content string
		want    int
	}{
		{`"` + text + `"`, 3},
		{`[{"type":"text","text":"` + text + `"}]`, 3},
		{`[{"type":"text","text":"` + text + `"},{"type":"text","text":"short"},{"type":"text","text":"` + text + `"}]`, 6},
	} {
		content := c.content
		r, e := Parse(Chat, []byte(`{"messages":[{"role":"user","content":`+content+`}]}`))
		if e != nil {
			t.Fatalf("%s: %+v", content, e)
		}
		if !r.Inject(marker, 48, false) {
			t.Fatalf("%s: not injected", content)
		}
		var msgs []struct {
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(r.Fields["messages"], &msgs); err != nil || len(msgs) != 2 {
			t.Fatalf("%s: messages %s", content, r.Fields["messages"])
		}
		if n := strings.Count(string(msgs[1].Content), marker); n != c.want {
			t.Errorf("%s: %d repetitions in the user content sent, want %d: %s", content, n, c.want, msgs[1].Content)
		}
		if n := strings.Count(r.contents[1], marker); n != c.want {
			t.Errorf("%s: %d repetitions in the text counted, want %d: %q", content, n, c.want, r.contents[1])
		}
	}
}
