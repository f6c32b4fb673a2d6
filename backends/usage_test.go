package backends

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

func decodeNum(t *testing.T, s string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return v
}

// tallyFile runs a whole reply (.json) or every event of a stream (.sse) through one tally.
func tallyFile(t *testing.T, name string) *UsageTally {
	t.Helper()
	b, err := os.ReadFile("testdata/usage/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var tl UsageTally
	if !strings.HasSuffix(name, ".sse") {
		tl.Add(decodeNum(t, string(b)), false)
		return &tl
	}
	for _, ev := range strings.Split(string(bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n"))), "\n\n") {
		for _, line := range strings.Split(ev, "\n") {
			if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
				tl.Add(decodeNum(t, data), true)
			}
		}
	}
	return &tl
}

// Every dialect, whole and streamed, in the shapes real servers send (testdata/usage; the
// SGLang and chat-stream bodies are /work/shared/fixtures'), read by the one reader.
func TestUsagePerRoute(t *testing.T) {
	for _, c := range []struct {
		route, file    string
		prompt, output int64
		textEvents     int64
	}{
		{"/v1/chat/completions", "chat.json", 21, 8, 0},
		{"/v1/chat/completions stream", "chat_stream.sse", 7, 12, 1}, // the role chunk's "" is no text
		{"/v1/completions stream", "completions_stream.sse", 4, 2, 2},
		{"/generate", "generate_response.json", 7, 128, 0},
		{"/generate stream (cumulative)", "generate_stream.sse", 7, 5, 3},
		{"/generate batch", "generate_batch.json", 7 + 9, 1 + 1, 0},
		{"/generate batch stream (per index)", "generate_batch_stream.sse", 7 + 9, 2 + 2, 4},
		{"/v1/responses", "responses.json", 36, 87, 0},
		{"/v1/responses stream (nested in response)", "responses_stream.sse", 37, 11, 2},
		{"/v1/messages (cache reads are prompt)", "messages.json", 2095 + 100, 503, 0},
		{"/v1/messages stream (message_start + message_delta)", "messages_stream.sse", 25, 15, 2},
	} {
		tl := tallyFile(t, c.file)
		p, pk, o, ok := tl.Totals()
		if !pk || !ok || p != c.prompt || o != c.output || tl.TextEvents != c.textEvents {
			t.Errorf("%s: prompt %d (%v) output %d (%v) text events %d; want %d, %d, %d", c.route, p, pk, o, ok, tl.TextEvents, c.prompt, c.output, c.textEvents)
		}
	}
}

// A count that is not a non-negative JSON integer within MaxTokenCount, or a usage object that
// contradicts itself, is unknown: never 0, never negative, and it does not half-count.
func TestUsageHostileIsUnknown(t *testing.T) {
	for _, u := range []string{
		`{"prompt_tokens":-100000000,"completion_tokens":5}`,
		`{"prompt_tokens":5,"completion_tokens":-1}`,
		`{"prompt_tokens":1e9,"completion_tokens":1}`,
		`{"prompt_tokens":1.5,"completion_tokens":1}`,
		`{"prompt_tokens":1.0,"completion_tokens":1}`,
		`{"prompt_tokens":"12","completion_tokens":1}`,
		`{"prompt_tokens":null,"completion_tokens":1}`,
		`{"prompt_tokens":true,"completion_tokens":1}`,
		`{"prompt_tokens":2147483649,"completion_tokens":1}`,
		`{"prompt_tokens":99999999999999999999999,"completion_tokens":1}`,
		`{"prompt_tokens":-0.0,"completion_tokens":1}`,
		`{"prompt_tokens":3,"completion_tokens":4,"total_tokens":100}`,
		`{"prompt_tokens":3,"input_tokens":300,"completion_tokens":4}`,
		`{"input_tokens":3,"output_tokens":4,"cache_read_input_tokens":-5}`,
		`{"input_tokens":3,"output_tokens":4,"total_tokens":-7}`,
		`[1,2]`, `7`, `"x"`, `{}`,
	} {
		for _, shape := range []string{`{"usage":%s}`, `{"meta_info":%s}`, `{"type":"response.completed","response":{"usage":%s}}`,
			`{"type":"message_start","message":{"usage":%s}}`} {
			body := strings.Replace(shape, "%s", u, 1)
			if rs := ReadUsage(decodeNum(t, body)); len(rs) != 0 {
				t.Errorf("%s read as %+v", body, rs)
			}
			if n := PromptCount(decodeNum(t, body)); n != 0 {
				t.Errorf("%s: prompt count %d", body, n)
			}
		}
	}
	// A native batch item with a bad index is unknown too; a good one is read at its index.
	if rs := ReadUsage(decodeNum(t, `{"index":-1,"meta_info":{"prompt_tokens":1,"completion_tokens":1}}`)); len(rs) != 0 {
		t.Errorf("negative index read as %+v", rs)
	}
	if rs := ReadUsage(decodeNum(t, `{"index":3,"meta_info":{"prompt_tokens":1,"completion_tokens":2}}`)); len(rs) != 1 || rs[0].Index != 3 {
		t.Errorf("index 3 read as %+v", rs)
	}
	// Half a reading: the prompt alone (a stream cut before message_delta) leaves output unknown.
	var tl UsageTally
	tl.Add(decodeNum(t, `{"type":"message_start","message":{"usage":{"input_tokens":25}}}`), true)
	if p, pk, _, ok := tl.Totals(); p != 25 || !pk || ok {
		t.Errorf("message_start alone: prompt %d %v, output known %v", p, pk, ok)
	}
	// Cumulative counts are never summed: the largest reading of each wins.
	tl = UsageTally{}
	for _, n := range []string{"1", "2", "3"} {
		tl.Add(decodeNum(t, `{"meta_info":{"prompt_tokens":7,"completion_tokens":`+n+`}}`), true)
	}
	if p, _, o, _ := tl.Totals(); p != 7 || o != 3 {
		t.Errorf("cumulative meta_info: %d + %d", p, o)
	}
}

// The events a stream without usage is charged by: those that carry generated text.
func TestCarriesText(t *testing.T) {
	for body, want := range map[string]bool{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`:                   false,
		`{"choices":[{"index":0,"delta":{"content":"x"}}]}`:                                     true,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"x"}}]}`:                           true,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`:                        true,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`:                           false,
		`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`:                      false,
		`{"choices":[{"index":0,"text":"x"}]}`:                                                  true,
		`{"text":" Paris","meta_info":{}}`:                                                      true,
		`{"type":"response.output_text.delta","delta":"x"}`:                                     true,
		`{"type":"response.output_text.done","text":"whole text again"}`:                        false,
		`{"type":"response.function_call_arguments.delta","delta":"{"}`:                         true,
		`{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`:               true,
		`{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}}`: true,
		`{"type":"ping"}`: false,
		`[1]`:             false,
	} {
		if got := CarriesText(decodeNum(t, body)); got != want {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
}
