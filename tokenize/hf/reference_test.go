package hf_test

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/tests/hfref"
	"github.com/kvgate/kvgate/tokenize/hf"
)

func modelDir(t testing.TB, model string) string { return hfref.ModelDir(t, model) }

var (
	loadMu sync.Mutex
	loaded = map[string]*hf.Tokenizer{}
)

func mustLoad(t testing.TB, model string) *hf.Tokenizer {
	t.Helper()
	dir := modelDir(t, model)
	loadMu.Lock()
	defer loadMu.Unlock()
	if tk := loaded[model]; tk != nil {
		return tk
	}
	tk, err := hf.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	loaded[model] = tk
	return tk
}

type chat = hfref.Chat

func runReference(t *testing.T, model string, texts []string, chats []chat) hfref.Result {
	return hfref.Reference(t, model, texts, chats)
}

// referenceTexts: prose, code, CJK, emoji, tool definitions, special tokens and adversarial
// text. Characters on which JavaScript's regex \s differs from the engines' (U+0085, U+FEFF)
// are left out: see the package tests' note in hf_test.go.
func referenceTexts() []string {
	texts := []string{
		"", "hello world", "Hello, World! It's a test. We'LL see, don't you think? I'm sure they've done it.",
		"The committee reviewed the quarterly report on Thursday and agreed that the new process had saved both time and money.\n\nSeveral members asked questions.",
		"func (s *Server) handle(w http.ResponseWriter, r *http.Request) {\n\tif err := s.db.Ping(r.Context()); err != nil {\n\t\treturn\n\t}\n}\n",
		"def parse(path):\n    with open(path) as f:\n        return [json.loads(line) for line in f if line.strip()]\n",
		"人工智能正在改变我们处理信息的方式，缓存中的数据必须被安全地隔离。東京の天気は明日も晴れるでしょう。오늘 회의는 오후 세 시에 시작합니다.",
		"emoji 😀👍🏽 🇫🇷 👨‍👩‍👧‍👦 ❤️ ✨✨✨", "3.14159265358979 2718281828459045 0xDEADBEEF 2026-12-02T14:33:22Z 192.168.100.254:8443 $1,234,567.89",
		`{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}`,
		"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
		"text <|endoftext|> more <think>reasoning</think> <tool_call>{}</tool_call> <|im_start", "e\u0301 cafe\u0301 A\u030a n\u0303 ﬁ Å", // NFC changes these for Qwen3
		"\n\t\n", "a\n\t\nb", "x   y\t\t z", "  \n  \n  z", "\r\n\r\n", "end   ", "x\u00a0 y\u2003z\u3000w",
		"'s 'S 'll 'LL 're 'VE 'd 'M 't", "ア・イ゠ウー 123abc4567中文89 x²y ①② (a.Net) #tag @user\u200bz 鿦中 ひらがなカタカナ漢字",
		"ʰello ǅungla CamelCase HTTPServer", "١٢٣٤ ½⅓ Ⅻ 12345678901234567890",
		strings.Repeat("a", 20000), strings.Repeat(" ", 20000), strings.Repeat("\n", 3000), strings.Repeat("=", 5000),
		"x" + strings.Repeat(" ", 3000) + "y", strings.Repeat("ab", 4000), strings.Repeat("😀", 2000), strings.Repeat("中", 5000),
		strings.Repeat("hello <|endoftext|> ", 300), strings.Repeat("!", 3333), strings.Repeat("é", 4000),
	}
	return texts
}

func referenceChats() []chat {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	tools := raw(`[{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7.5}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "search", "description": "Search the web: \"quoted\" & <tagged> 中文", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]`)
	return []chat{
		{Messages: raw(`[{"role": "user", "content": "hi"}]`), AddGenerationPrompt: true},
		{Messages: raw(`[{"role": "user", "content": "hi"}]`), AddGenerationPrompt: false},
		{Messages: raw(`[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Write a haiku about caches.\n\nPlease."}, {"role": "assistant", "content": "Keys fade, values stay."}, {"role": "user", "content": "Another, in 中文 😀"}]`), AddGenerationPrompt: true},
		{Messages: raw(`[{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}]`), Tools: tools, AddGenerationPrompt: true},
		{Messages: raw(`[{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}, {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "user", "content": "Thanks"}]`), Tools: tools, AddGenerationPrompt: true},
		{Messages: raw(`[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n4"}, {"role": "user", "content": "3+3?"}]`), AddGenerationPrompt: true},
		{Messages: raw(`[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "add them"}]`), AddGenerationPrompt: false},
		{Messages: raw(`[{"role": "user", "content": "think less"}]`), AddGenerationPrompt: true, Kwargs: raw(`{"enable_thinking": false}`)},
		{Messages: raw(`[{"role": "user", "content": "  padded content with trailing spaces   \n"}]`), AddGenerationPrompt: true},
	}
}

// deepseekChats are tool calls as DeepSeek V3's template expects them (content null, arguments a
// JSON string), two in one turn, then two tool results. (Qwen3's and Llama 3's templates, in
// @huggingface/jinja, raise on the null content.)
func deepseekChats() []chat {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	tools := referenceChats()[3].Tools
	return []chat{
		{Messages: raw(`[{"role": "system", "content": "Use tools."}, {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris and 東京?"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"東京\", \"days\": 3}"}}]}, {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"temp\": 12}"}, {"role": "assistant", "content": "Paris 21°C, 東京 12°C."}, {"role": "user", "content": "Thanks 😀"}]`), Tools: tools, AddGenerationPrompt: true},
	}
}

// TestCountsEqualHuggingFace: for Qwen3, Llama 3 and DeepSeek V3, the count of every corpus text
// and the rendering (and count) of every chat equal Hugging Face's JavaScript tokenizer and Jinja;
// a chat the reference's template refuses (raise_exception, a type error) is refused here too.
func TestCountsEqualHuggingFace(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3", "deepseek_v3"} {
		t.Run(model, func(t *testing.T) {
			tk := mustLoad(t, model)
			texts, chats := referenceTexts(), referenceChats()
			if model == "deepseek_v3" {
				chats = append(chats, deepseekChats()...)
			}
			ref := runReference(t, model, texts, chats)
			for i, text := range texts {
				got, complete := tk.Count(text, -1)
				if got != ref.Counts[i] || !complete {
					t.Errorf("Count(%.60q…) = %d, %v; @huggingface/tokenizers %d", text, got, complete, ref.Counts[i])
				}
				// The tokens themselves (what the simulator generates from) are the reference's too.
				ids, pieces := tk.Encode(text)
				if !slices.Equal(ids, ref.IDs[i]) || len(pieces) != len(ids) {
					t.Errorf("Encode(%.60q…): %d ids differ from @huggingface/tokenizers' %d", text, len(ids), len(ref.IDs[i]))
				}
			}
			for i, c := range chats {
				var want string
				got, err := tk.Render(c.Messages, c.Tools, c.AddGenerationPrompt, c.Kwargs)
				if json.Unmarshal(ref.Renders[i], &want) != nil {
					if err == nil {
						t.Errorf("chat %d: rendered %q where the reference raised %s", i, got, ref.Renders[i])
					} else {
						t.Logf("chat %d: refused as by the reference (%v; reference %s)", i, err, ref.Renders[i])
					}
					continue
				}
				if err != nil {
					t.Errorf("chat %d: Render: %v", i, err)
					continue
				}
				if got != want {
					t.Errorf("chat %d: render differs from @huggingface/jinja:\n got %q\nwant %q", i, got, want)
					continue
				}
				if n, _ := tk.Count(got, -1); n != ref.RenderCounts[i] {
					t.Errorf("chat %d: Count(render) = %d, reference %d", i, n, ref.RenderCounts[i])
				}
			}
		})
	}
}
