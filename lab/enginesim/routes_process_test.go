package enginesim_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
)

// smallSim: chunk4 makes counts exact ("abcd" is one token); pool 1000 →
// 992 (62 pages of 16), so max_req_input_len = min(2047, 991) − 5 = 986.
func smallSim(t *testing.T) *procs.Sim {
	return procs.StartSim(t, "--pool-tokens", "1000", "--context-length", "2048", "--page-size", "16", "--tokenizer", "chunk4")
}

const smallMril = 986

func words(n int) string { return strings.Repeat("abcd", n) }

type sseFrame struct {
	event string
	data  map[string]any
}

// frames splits an SSE body into its events; a frame without data is skipped.
func frames(t *testing.T, body []byte) []sseFrame {
	t.Helper()
	var out []sseFrame
	for _, raw := range strings.Split(string(body), "\n\n") {
		var f sseFrame
		for _, line := range strings.Split(raw, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				f.event = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				if err := json.Unmarshal([]byte(v), &f.data); err != nil {
					t.Fatalf("bad data line %q: %v", v, err)
				}
			}
		}
		if f.data != nil {
			out = append(out, f)
		}
	}
	return out
}

func decode(t *testing.T, r reply, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

// openAIErr checks SGLang's OpenAI-route error envelope.
func openAIErr(t *testing.T, what string, r reply, status int, msgPrefix string) {
	t.Helper()
	var e struct {
		Object, Message, Type string
		Code                  int
	}
	if err := json.Unmarshal(r.body, &e); err != nil || r.status != status || e.Object != "error" || e.Code != status || !strings.HasPrefix(e.Message, msgPrefix) {
		t.Errorf("%s: %d %s, want %d with message %q…", what, r.status, r.body, status, msgPrefix)
	}
}

func anthropicErr(t *testing.T, what string, r reply, status int, typ, msgPrefix string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || r.status != status || e.Type != "error" || e.Error.Type != typ || !strings.HasPrefix(e.Error.Message, msgPrefix) {
		t.Errorf("%s: %d %s, want %d %s with message %q…", what, r.status, r.body, status, typ, msgPrefix)
	}
}

const poolMsg = "Input length ("

func TestResponsesRoute(t *testing.T) {
	sim := smallSim(t)
	body := map[string]any{"model": "m", "instructions": "be brief", "max_output_tokens": 6, "cache_salt": "tenant-a",
		"input": []any{map[string]any{"role": "user", "content": "alpha beta gamma delta epsilon"},
			map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "zeta eta"}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "theta iota kappa"}}}}}
	r := post(t, sim.URL, "/v1/responses", body)
	var resp struct {
		ID, Object, Status string
		Output             []struct {
			Type, Role string
			Content    []struct{ Type, Text string }
		}
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}
	}
	decode(t, r, &resp)
	if r.status != 200 || !strings.HasPrefix(resp.ID, "resp_") || resp.Object != "response" || resp.Status != "completed" ||
		len(resp.Output) != 1 || resp.Output[0].Type != "message" || resp.Output[0].Role != "assistant" ||
		len(resp.Output[0].Content) != 1 || resp.Output[0].Content[0].Type != "output_text" || resp.Output[0].Content[0].Text == "" ||
		resp.Usage.OutputTokens != 6 || resp.Usage.InputTokens == 0 || resp.Usage.TotalTokens != resp.Usage.InputTokens+6 {
		t.Fatalf("responses reply: %d %s", r.status, r.body)
	}
	// The prompt is rendered like chat, instructions first as a system message.
	var tok struct{ Count int }
	decode(t, post(t, sim.URL, "/tokenize", map[string]any{"prompt": "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nalpha beta gamma delta epsilon<|im_end|>\n" +
		"<|im_start|>assistant\nzeta eta<|im_end|>\n<|im_start|>user\ntheta iota kappa<|im_end|>\n<|im_start|>assistant\n"}), &tok)
	if tok.Count != resp.Usage.InputTokens {
		t.Errorf("input_tokens %d, ChatML rendering counts %d", resp.Usage.InputTokens, tok.Count)
	}

	// previous_response_id extends the prompt with the stored conversation and reply.
	r2 := post(t, sim.URL, "/v1/responses", map[string]any{"input": "more", "previous_response_id": resp.ID, "max_output_tokens": 2, "cache_salt": "tenant-b"})
	var resp2 struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		}
	}
	decode(t, r2, &resp2)
	if r2.status != 200 || resp2.Usage.InputTokens <= resp.Usage.InputTokens {
		t.Errorf("previous_response_id did not extend the prompt: %d %s (first had %d input tokens)", r2.status, r2.body, resp.Usage.InputTokens)
	}
	openAIErr(t, "unknown previous_response_id", post(t, sim.URL, "/v1/responses", map[string]any{"input": "x", "previous_response_id": "resp_nope"}), 404, "Previous response")

	// Streaming: named events, deltas that add up to the done text, a completed response with usage.
	body["stream"] = true
	fs := frames(t, post(t, sim.URL, "/v1/responses", body).body)
	var deltas strings.Builder
	var doneText string
	var types []string
	for _, f := range fs {
		if f.event != f.data["type"] {
			t.Errorf("event %q carries type %v", f.event, f.data["type"])
		}
		types = append(types, f.event)
		switch f.event {
		case "response.output_text.delta":
			deltas.WriteString(f.data["delta"].(string))
		case "response.output_text.done":
			doneText = f.data["text"].(string)
		case "response.completed":
			u := f.data["response"].(map[string]any)["usage"].(map[string]any)
			if u["output_tokens"].(float64) != 6 || f.data["response"].(map[string]any)["status"] != "completed" {
				t.Errorf("response.completed: %v", f.data)
			}
		}
	}
	if len(types) < 4 || types[0] != "response.created" || types[len(types)-1] != "response.completed" ||
		deltas.Len() == 0 || deltas.String() != doneText || strings.Count(strings.Join(types, ","), "output_text.delta") != 6 {
		t.Errorf("stream events %v, deltas %q, done %q", types, deltas.String(), doneText)
	}

	// Admission: the pool check (the ChatML wrapping adds a few tokens) and prompt+output ≥ context.
	openAIErr(t, "oversized", post(t, sim.URL, "/v1/responses", map[string]any{"input": words(smallMril)}), 400, poolMsg)
	openAIErr(t, "P+O", post(t, sim.URL, "/v1/responses", map[string]any{"input": words(100), "max_output_tokens": 2000}), 400, "Requested token count exceeds")
	st := sim.Stats(t)
	if st.Requests["/v1/responses"] != 6 || st.MaxPromptTokens < smallMril || st.MaxPromptTokens > smallMril+16 || st.Rejected["pool"] != 1 || st.Rejected["total"] != 1 ||
		st.CacheSalts != 2 || st.Pool.PagesFree != st.Pool.PagesTotal {
		t.Errorf("stats %+v", st)
	}
}

func TestMessagesRoute(t *testing.T) {
	sim := smallSim(t)
	body := map[string]any{"model": "claude-x", "max_tokens": 5, "cache_salt": "s1",
		"system":   []any{map[string]any{"type": "text", "text": "you are terse"}},
		"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "one two three four five six"}}}}}
	r := post(t, sim.URL, "/v1/messages", body)
	var m struct {
		ID, Type, Role, Model string
		StopReason            string `json:"stop_reason"`
		Content               []struct{ Type, Text string }
		Usage                 struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	decode(t, r, &m)
	if r.status != 200 || !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "claude-x" ||
		m.StopReason != "max_tokens" || len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text == "" ||
		m.Usage.OutputTokens != 5 || m.Usage.InputTokens == 0 {
		t.Fatalf("messages reply: %d %s", r.status, r.body)
	}
	var ct struct {
		InputTokens int `json:"input_tokens"`
	}
	ctr := post(t, sim.URL, "/v1/messages/count_tokens", body)
	decode(t, ctr, &ct)
	if ctr.status != 200 || ct.InputTokens != m.Usage.InputTokens {
		t.Errorf("count_tokens %d %s, messages counted %d", ctr.status, ctr.body, m.Usage.InputTokens)
	}

	body["stream"] = true
	fs := frames(t, post(t, sim.URL, "/v1/messages", body).body)
	var events []string
	var text strings.Builder
	for _, f := range fs {
		if f.event != f.data["type"] {
			t.Errorf("event %q carries type %v", f.event, f.data["type"])
		}
		events = append(events, f.event)
		switch f.event {
		case "content_block_delta":
			d := f.data["delta"].(map[string]any)
			if d["type"] != "text_delta" || f.data["index"].(float64) != 0 {
				t.Errorf("delta %v", f.data)
			}
			text.WriteString(d["text"].(string))
		case "message_delta":
			if f.data["delta"].(map[string]any)["stop_reason"] != "max_tokens" || f.data["usage"].(map[string]any)["output_tokens"].(float64) != 5 {
				t.Errorf("message_delta %v", f.data)
			}
		}
	}
	want := "message_start,content_block_start," + strings.Repeat("content_block_delta,", 5) + "content_block_stop,message_delta,message_stop"
	if strings.Join(events, ",") != want || text.Len() == 0 {
		t.Errorf("stream events %v text %q", events, text.String())
	}

	user := func(content string, maxTokens any) map[string]any {
		b := map[string]any{"messages": []any{map[string]any{"role": "user", "content": content}}}
		if maxTokens != nil {
			b["max_tokens"] = maxTokens
		}
		return b
	}
	anthropicErr(t, "no max_tokens", post(t, sim.URL, "/v1/messages", user("hi", nil)), 400, "invalid_request_error", "max_tokens")
	anthropicErr(t, "bad role", post(t, sim.URL, "/v1/messages", map[string]any{"max_tokens": 3, "messages": []any{map[string]any{"role": "system", "content": "x"}}}),
		400, "invalid_request_error", "messages.0.role")
	anthropicErr(t, "oversized", post(t, sim.URL, "/v1/messages", user(words(smallMril), 4)), 400, "invalid_request_error", poolMsg)
	anthropicErr(t, "P+O", post(t, sim.URL, "/v1/messages", user(words(100), 2000)), 400, "invalid_request_error", "Requested token count exceeds")
	st := sim.Stats(t)
	if st.Requests["/v1/messages"] != 6 || st.Requests["/v1/messages/count_tokens"] != 1 || st.MaxPromptTokens < smallMril || st.MaxPromptTokens > smallMril+16 ||
		st.Rejected["pool"] != 1 || st.Rejected["total"] != 1 || st.CacheSalts != 1 || st.Pool.PagesFree != st.Pool.PagesTotal {
		t.Errorf("stats %+v", st)
	}
}

func TestPrefillOnlyRoutes(t *testing.T) {
	sim := smallSim(t)
	half := words(smallMril / 2) // each half fits, a query+document pair of two does not
	cases := []struct {
		path     string
		ok, big  map[string]any
		check    func(t *testing.T, r reply)
		native   bool
		bigCount int // prompt tokens of the refused request's failing input
	}{
		{"/v1/embeddings", map[string]any{"input": []any{"hello there", "general kenobi"}, "cache_salt": "e"},
			map[string]any{"input": words(smallMril)}, func(t *testing.T, r reply) {
				var v struct {
					Object string
					Data   []struct {
						Object    string
						Index     int
						Embedding []float64
					}
					Usage struct {
						PromptTokens int `json:"prompt_tokens"`
						TotalTokens  int `json:"total_tokens"`
					}
				}
				decode(t, r, &v)
				if v.Object != "list" || len(v.Data) != 2 || v.Data[1].Index != 1 || v.Data[0].Object != "embedding" || len(v.Data[0].Embedding) != 8 ||
					v.Usage.PromptTokens == 0 || v.Usage.TotalTokens != v.Usage.PromptTokens {
					t.Errorf("embeddings: %s", r.body)
				}
			}, false, smallMril},
		{"/v1/embeddings", map[string]any{"input": []any{[]int{1, 2, 3}, []int{4, 5}}}, nil, func(t *testing.T, r reply) {
			if !strings.Contains(string(r.body), `"prompt_tokens":5`) {
				t.Errorf("embeddings of id lists: %s", r.body)
			}
		}, false, 0},
		{"/v1/rerank", map[string]any{"query": "what is panda?", "documents": []any{"hi", "the giant panda is a bear"}, "top_n": 2},
			map[string]any{"query": half, "documents": []any{"ok", half}}, func(t *testing.T, r reply) {
				var v []struct {
					Score    float64
					Document string
					Index    int
				}
				decode(t, r, &v)
				if len(v) != 2 || v[0].Score < v[1].Score || v[0].Document == "" || v[0].Index == v[1].Index {
					t.Errorf("rerank: %s", r.body)
				}
			}, false, 2 * (smallMril / 2)},
		{"/v1/score", map[string]any{"query": "the capital of France is", "items": []any{" Paris", " Berlin"}, "label_token_ids": []int{1, 2}, "apply_softmax": true},
			map[string]any{"query": half, "items": []any{half}}, func(t *testing.T, r reply) {
				var v struct {
					Scores [][]float64
					Object string
				}
				decode(t, r, &v)
				if v.Object != "scoring" || len(v.Scores) != 2 || len(v.Scores[0]) != 2 || v.Scores[0][0]+v.Scores[0][1] < 0.999 {
					t.Errorf("score: %s", r.body)
				}
			}, false, 2 * (smallMril / 2)},
		{"/v1/classify", map[string]any{"input": "is this spam"}, map[string]any{"input": []any{"fine", words(smallMril + 3)}}, func(t *testing.T, r reply) {
			var v struct {
				Object string
				Data   []struct {
					Index int
					Label string
					Probs []float64
				}
			}
			decode(t, r, &v)
			if v.Object != "list" || len(v.Data) != 1 || !strings.HasPrefix(v.Data[0].Label, "LABEL_") || len(v.Data[0].Probs) != 2 {
				t.Errorf("classify: %s", r.body)
			}
		}, false, smallMril + 3},
		{"/encode", map[string]any{"text": "encode me"}, map[string]any{"text": words(smallMril)}, func(t *testing.T, r reply) {
			var v struct {
				Embedding []float64
				Meta      struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"meta_info"`
			}
			decode(t, r, &v)
			if len(v.Embedding) != 8 || v.Meta.PromptTokens != 4 {
				t.Errorf("/encode: %s", r.body)
			}
		}, true, smallMril},
		{"/classify", map[string]any{"input_ids": [][]int{{7, 8}, {9}}}, map[string]any{"input_ids": make([]int, smallMril)}, func(t *testing.T, r reply) {
			var v []struct {
				Embedding []float64
			}
			decode(t, r, &v)
			if len(v) != 2 || len(v[0].Embedding) != 2 {
				t.Errorf("/classify: %s", r.body)
			}
		}, true, smallMril},
	}
	want := map[string]int{}
	for _, c := range cases {
		r := post(t, sim.URL, c.path, c.ok)
		want[c.path]++
		if r.status != 200 {
			t.Errorf("%s: %d %s", c.path, r.status, r.body)
			continue
		}
		c.check(t, r)
		if c.big == nil {
			continue
		}
		before := sim.Stats(t).Rejected["pool"]
		r = post(t, sim.URL, c.path, c.big)
		want[c.path]++
		msg := fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens).", c.bigCount, smallMril)
		if c.native {
			if r.status != 400 || !strings.HasPrefix(string(r.body), `{"error":{"message":"`+msg) {
				t.Errorf("%s oversized: %d %s", c.path, r.status, r.body)
			}
		} else {
			openAIErr(t, c.path+" oversized", r, 400, msg)
		}
		if got := sim.Stats(t).Rejected["pool"]; got != before+1 {
			t.Errorf("%s oversized: pool rejections %d → %d", c.path, before, got)
		}
	}
	st := sim.Stats(t)
	for path, n := range want {
		if st.Requests[path] != n {
			t.Errorf("requests[%s] = %d, want %d", path, st.Requests[path], n)
		}
	}
	if st.MaxPromptTokens != smallMril+3 || st.CacheSalts != 1 || st.Pool.PagesFree != st.Pool.PagesTotal {
		t.Errorf("stats %+v", st)
	}
}

func TestDetokenizeInvertsTokenize(t *testing.T) {
	texts := []string{"hello world", "  two  spaces ", "<|im_start|>user\nhé llo ünïcødé 🎉<|im_end|>", "KVG-abcdefabcdef12345678 a", "x"}
	for _, tk := range []string{"cl100k", "chunk4"} {
		t.Run(tk, func(t *testing.T) {
			sim := procs.StartSim(t, "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16", "--tokenizer", tk)
			for _, path := range []string{"/detokenize", "/v1/detokenize"} {
				var all [][]uint32
				for _, x := range texts {
					var tok struct{ Tokens []uint32 }
					decode(t, post(t, sim.URL, "/v1/tokenize", map[string]any{"prompt": x}), &tok)
					var de struct{ Text string }
					r := post(t, sim.URL, path, map[string]any{"tokens": tok.Tokens})
					decode(t, r, &de)
					if r.status != 200 || de.Text != x {
						t.Errorf("%s(tokenize(%q)) = %d %q", path, x, r.status, de.Text)
					}
					all = append(all, tok.Tokens)
				}
				var batch struct{ Text []string }
				decode(t, post(t, sim.URL, path, map[string]any{"tokens": all}), &batch)
				if strings.Join(batch.Text, "|") != strings.Join(texts, "|") {
					t.Errorf("batched %s: %q", path, batch.Text)
				}
			}
			if st := sim.Stats(t); st.Requests["/detokenize"] != 6 || st.Requests["/v1/detokenize"] != 6 {
				t.Errorf("stats %+v", st.Requests)
			}
		})
	}
}

func TestAdminRoutesExist(t *testing.T) {
	sim := smallSim(t)
	for _, path := range []string{"/flush_cache", "/update_weights_from_disk", "/start_profile", "/stop_profile"} {
		if r := post(t, sim.URL, path, map[string]any{"model_path": "x"}); r.status != 200 {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
	}
	if r := post(t, sim.URL, "/abort_request", map[string]any{"rid": "none"}); r.status != 200 {
		t.Errorf("/abort_request: %d", r.status)
	}
	st := sim.Stats(t)
	for _, path := range []string{"/flush_cache", "/update_weights_from_disk", "/start_profile", "/stop_profile"} {
		if st.Requests[path] != 1 {
			t.Errorf("requests[%s] = %d, want 1", path, st.Requests[path])
		}
	}
}

// routeBody builds a body of route path with text as the prompt.
func routeBody(path, text, rid string, maxTokens int) map[string]any {
	switch path {
	case "/v1/responses":
		return map[string]any{"input": text, "rid": rid, "max_output_tokens": maxTokens}
	case "/v1/messages":
		return map[string]any{"messages": []any{map[string]any{"role": "user", "content": text}}, "rid": rid, "max_tokens": maxTokens}
	}
	panic(path)
}

// The leak reproduces on the new generation routes exactly as on chat:
// warm-ups leave markers in decode's stale pages, an oversized prompt is
// stubbed by the buggy prefill, and decode answers from those pages, in
// both reply forms.
func TestPDBugLeaksOnResponsesAndMessages(t *testing.T) {
	for _, path := range []string{"/v1/responses", "/v1/messages"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", strings.Trim(path, "/"), stream), func(t *testing.T) {
				pre := procs.StartSim(t, withFlags(prefillArgs, "--bug", "admit-rejected")...)
				dec := procs.StartSim(t, decodeArgs...)
				var markers, rids []string
				for i := 0; i < 3; i++ {
					m, rid := marker(i), fmt.Sprintf("warm-%d", i)
					p, d := pdPost(t, pre, dec, path, routeBody(path, warmText(m, 60+40*(2-i)), rid, 16), 1000+i)
					if p.status != 200 || d.status != 200 || foreignIDs(d.header) != nil {
						t.Fatalf("warm-up %d: prefill %d %s, decode %d %s foreign=%v", i, p.status, p.body, d.status, d.body, foreignIDs(d.header))
					}
					markers, rids = append(markers, m), append(rids, rid)
				}
				body := routeBody(path, strings.Repeat("filler ", 3000), "victim", 512)
				body["stream"] = stream
				p, d := pdPost(t, pre, dec, path, body, 7)
				if p.status != 200 || d.status != 200 {
					t.Fatalf("prefill %d %s, decode %d %s: want 200 from both legs", p.status, p.body, d.status, d.body)
				}
				var text string
				switch {
				case stream:
					for _, f := range frames(t, d.body) {
						if v, ok := f.data["delta"].(string); ok {
							text += v
						} else if dm, ok := f.data["delta"].(map[string]any); ok && dm["text"] != nil {
							text += dm["text"].(string)
						}
					}
				case path == "/v1/responses":
					var v struct {
						Output []struct{ Content []struct{ Text string } }
					}
					decode(t, d, &v)
					text = v.Output[0].Content[0].Text
				default:
					var v struct{ Content []struct{ Text string } }
					decode(t, d, &v)
					text = v.Content[0].Text
				}
				leaked := 0
				for _, m := range markers {
					if strings.Contains(text, m) {
						leaked++
					}
				}
				if leaked < 2 || len(foreignIDs(d.header)) == 0 {
					t.Errorf("reply quotes %d of %d earlier markers (foreign=%v): %.300q", leaked, len(markers), foreignIDs(d.header), text)
				}
				if n := dec.Stats(t).ForeignReplies; n != 1 {
					t.Errorf("decode foreign_replies = %d, want 1", n)
				}
			})
		}
	}
}

// Every generation route accepts cache_salt; the distinct values are what
// /sim/stats shows (the simulator has no prefix cache to partition).
func TestCacheSaltCounted(t *testing.T) {
	sim := smallSim(t)
	msgs := []any{map[string]any{"role": "user", "content": "hi"}}
	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{"/generate", map[string]any{"text": "a b", "cache_salt": "s-gen", "sampling_params": map[string]any{"max_new_tokens": 2}}},
		{"/v1/completions", map[string]any{"prompt": "a b", "cache_salt": "s-cmp", "max_tokens": 2}},
		{"/v1/chat/completions", map[string]any{"messages": msgs, "cache_salt": "s-chat", "max_tokens": 2}},
		{"/v1/responses", map[string]any{"input": "hi", "cache_salt": "s-chat", "max_output_tokens": 2}}, // a repeat
		{"/v1/messages", map[string]any{"messages": msgs, "cache_salt": "s-msg", "max_tokens": 2}},
	} {
		if r := post(t, sim.URL, c.path, c.body); r.status != 200 {
			t.Errorf("%s with cache_salt: %d %s", c.path, r.status, r.body)
		}
	}
	openAIErr(t, "cache_salt of the wrong type", post(t, sim.URL, "/v1/chat/completions", map[string]any{"messages": msgs, "cache_salt": 7}), 400, "cache_salt")
	if st := sim.Stats(t); st.CacheSalts != 4 {
		t.Errorf("cache_salts = %d, want 4", st.CacheSalts)
	}
}
