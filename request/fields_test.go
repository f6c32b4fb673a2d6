package request

import (
	stdjson "encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// fullBodies carry, per route, every field of its table that is not refused (together: each
// body must parse, and their fields together must cover the table's rows).
var fullBodies = map[Kind][]string{
	Chat: {`{"model":"m","messages":[
		{"role":"system","content":"s","name":"n"},
		{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII=","detail":"auto"}}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","index":0,"function":{"name":"f","arguments":"{\"a\":1}"}}],
		 "function_call":{"name":"f","arguments":"{}"},"reasoning_content":"r","refusal":null},
		{"role":"tool","content":"out","tool_call_id":"c1"}],
		"max_tokens":5,"max_completion_tokens":5,"temperature":0.5,"top_p":1,"top_k":5,"min_p":0,"n":1,"stream":false,
		"stream_options":{"include_usage":true,"continuous_usage_stats":false},"stop":["x"],"stop_token_ids":[1],
		"presence_penalty":0,"frequency_penalty":0,"repetition_penalty":1,"logit_bias":{"1":0},"logprobs":false,"top_logprobs":0,
		"user":"u","seed":1,
		"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{}},"strict":false}}],
		"tool_choice":{"type":"function","function":{"name":"f"}},
		"functions":[{"name":"f","description":"d","parameters":{}}],"function_call":{"name":"f"},
		"response_format":{"type":"json_schema","json_schema":{"name":"s","description":"d","schema":{},"strict":true},"structures":[],"triggers":[],"schema":{}},
		"parallel_tool_calls":true,"reasoning_effort":"low","separate_reasoning":true,"stream_reasoning":true,
		"chat_template_kwargs":{"enable_thinking":false,"thinking":true,"reasoning_effort":"low"},
		"regex":"x","ebnf":"x","json_schema":"{}","ignore_eos":false,"skip_special_tokens":true,"no_stop_trim":false,"min_tokens":0,
		"continue_final_message":false,"add_generation_prompt":true,"lora_path":"l","metadata":{"k":"v"},"store":false,
		"service_tier":"auto","cache_salt":"s"}`},
	Completions: {`{"model":"m","prompt":"hi","suffix":"s","max_tokens":5,"temperature":0.5,"top_p":1,"top_k":5,"min_p":0,"n":1,
		"stream":false,"stream_options":{"include_usage":true,"continuous_usage_stats":false},"stop":"x","stop_token_ids":[1],
		"presence_penalty":0,"frequency_penalty":0,"repetition_penalty":1,"logit_bias":{"1":0},"logprobs":0,"user":"u","seed":1,
		"regex":"x","ebnf":"x","json_schema":"{}","ignore_eos":false,"skip_special_tokens":true,"no_stop_trim":false,"min_tokens":0,
		"lora_path":"l","cache_salt":"s","echo":false,"best_of":1}`},
	Generate: {`{"text":"hi","sampling_params":{"max_new_tokens":5,"min_new_tokens":0,"stop":["x"],"stop_token_ids":[1],"stop_regex":"x",
		"temperature":1,"top_p":1,"top_k":1,"min_p":0,"frequency_penalty":0,"presence_penalty":0,"repetition_penalty":1,"n":1,
		"json_schema":"{}","regex":"x","ebnf":"x","structural_tag":"x","ignore_eos":false,"skip_special_tokens":true,
		"spaces_between_special_tokens":true,"no_stop_trim":false,"stream_interval":1,"logit_bias":{"1":0},"sampling_seed":1,"thinking_budget":64},
		"stream":false,"return_logprob":false,"logprob_start_len":0,"top_logprobs_num":0,"token_ids_logprob":[1],
		"return_text_in_logprobs":false,"lora_path":"l","log_metrics":false}`, `{"input_ids":[1,2]}`},
	Responses: {`{"model":"m","input":[
		{"role":"user","content":"hi","id":"i","status":"completed"},
		{"type":"message","role":"assistant","id":"m","status":"completed","content":[{"type":"output_text","text":"t","annotations":[],"logprobs":[]},
		 {"type":"input_text","text":"x","cache_control":null},{"type":"text","text":"y"}]},
		{"role":"user","content":[{"type":"input_text","text":"z","annotations":[],"logprobs":[],"cache_control":null},{"type":"output_text","text":"z","annotations":[],"logprobs":[],"cache_control":null},{"type":"text","text":"z","annotations":[],"logprobs":[],"cache_control":null},
		 {"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII=","detail":"auto"}]},
		{"type":"function_call","id":"f","call_id":"c","name":"n","arguments":"{}","status":"completed"},
		{"type":"function_call_output","id":"o","call_id":"c","output":"r","status":"completed"},
		{"type":"reasoning","id":"r","summary":[],"content":[],"encrypted_content":"e","status":"completed"},
		{"type":"custom_tool_call","id":"t","call_id":"c2","name":"n","input":"i","status":"completed"},
		{"type":"custom_tool_call_output","id":"u","call_id":"c2","output":"o"}],
		"instructions":"be terse","max_output_tokens":5,"temperature":1,"top_p":1,"stream":false,
		"stream_options":{"include_usage":true,"include_obfuscation":false},
		"tools":[{"type":"function","name":"f","description":"d","parameters":{},"strict":true}],"tool_choice":{"type":"function","name":"f"},
		"parallel_tool_calls":true,"text":{"format":{"type":"json_schema","name":"n","description":"d","schema":{},"strict":true},"verbosity":"low"},
		"reasoning":{"effort":"low","summary":"auto","generate_summary":"auto"},"metadata":{"a":"b"},"store":false,"user":"u",
		"truncation":"disabled","include":[],"top_logprobs":0,"service_tier":"auto","cache_salt":"s",
		"previous_response_id":"r","conversation":"c"}`,
		`{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a","annotations":[],"logprobs":[],"cache_control":null},{"type":"output_text","text":"b","cache_control":null},{"type":"text","text":"c","annotations":[],"logprobs":[],"cache_control":null},{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII=","detail":"low"}]}]}`},
	Messages: {`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],
		"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}},
		 {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAC0lEQVR4nGNgQAYAAA4AAamRc7EAAAAASUVORK5CYII="},"cache_control":null},
		 {"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]},
		{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"},
		 {"type":"tool_use","id":"t1","name":"f","input":{},"cache_control":null}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r","is_error":false,"cache_control":null}]}],
		"stop_sequences":["x"],"stream":false,"temperature":1,"top_p":1,"top_k":5,"metadata":{"user_id":"u"},
		"tools":[{"name":"f","description":"d","input_schema":{},"type":"custom","cache_control":null}],
		"tool_choice":{"type":"auto","name":"f","disable_parallel_tool_use":false},
		"thinking":{"type":"enabled","budget_tokens":1024},"service_tier":"auto","cache_salt":"s"}`},
	Embeddings:     {`{"model":"m","input":"x","encoding_format":"float","dimensions":8,"user":"u"}`},
	Rerank:         {`{"model":"m","query":"q","documents":["d"],"top_n":1,"return_documents":true}`},
	Score:          {`{"model":"m","query":"q","items":["d"],"label_token_ids":[1],"apply_softmax":true,"item_first":false}`},
	Classify:       {`{"model":"m","input":"x","user":"u"}`},
	Encode:         {`{"text":"x"}`, `{"input_ids":[1]}`},
	ClassifyNative: {`{"text":"x"}`, `{"input_ids":[1]}`},
}

// normPath drops array syntax and indexes: "messages[2].content[type=text].text" and
// "messages.2.content" become "messages.content[type=text].text" and "messages.content".
var (
	indexRE   = regexp.MustCompile(`\[\d*\]|\.\d+\b`)
	variantRE = regexp.MustCompile(`\[type=[^\]]*\]`)
)

func normPath(p string) string { return indexRE.ReplaceAllString(p, "") }

func decodeAny(t *testing.T, body string) any {
	t.Helper()
	dec := stdjson.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%v: %.200s", err, body)
	}
	return v
}

// location is one object of a body the table checks: where it is (in the error's path syntax)
// and in the table's.
type location struct {
	obj       map[string]any
	path, row string
}

// visit calls f with every object of v that the table node n checks, and collects the table paths
// of the fields present (normalised).
func visit(v any, n *fieldNode, path, row string, f func(location), seen map[string]bool) {
	if n == nil || !n.checked() {
		return
	}
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			visit(e, n, fmt.Sprintf("%s[%d]", path, i), row, f, seen)
		}
	case map[string]any:
		kids := n.kids
		if n.byType != nil {
			typ, _ := x["type"].(string)
			vn := n.byType[typ]
			if vn == nil {
				return
			}
			row += "[type=" + typ + "]"
			seen[row] = true
			kids = vn.kids
		}
		f(location{obj: x, path: path, row: row})
		for k, val := range x {
			kn := kids[k]
			if kn == nil {
				continue
			}
			seen[row+"."+k] = true
			visit(val, kn, path+"."+k, row+"."+k, f, seen)
		}
	}
}

func mustParse(t *testing.T, kind Kind, body []byte) *Request {
	t.Helper()
	r, e := Parse(kind, body)
	if e != nil {
		t.Fatalf("%s: %s (%s): %.300s", kind.Path(), e.Message, e.Param, body)
	}
	return r
}

// TestFieldTableCoversEveryDepth walks the field table: every route's full bodies parse; together
// they carry every field the table lets through; and an unknown field in any object the engine
// reads, at any depth, is refused naming its path (so a field with no verdict never passes).
func TestFieldTableCoversEveryDepth(t *testing.T) {
	for kind := Kind(0); kind < Kinds; kind++ {
		bodies := fullBodies[kind]
		if len(bodies) == 0 {
			t.Errorf("%s: no full body", kind.Path())
			continue
		}
		seen := map[string]bool{}
		for bi, body := range bodies {
			mustParse(t, kind, []byte(body))
			v := decodeAny(t, body)
			root := fieldTrees[kind]
			top := v.(map[string]any)
			for k := range top {
				seen[k] = true
			}
			var locs []location
			for k, val := range top {
				visit(val, root.kids[k], k, k, func(l location) { locs = append(locs, l) }, seen)
			}
			locs = append(locs, location{obj: top})
			for _, l := range locs {
				l.obj["zz_unknown"] = 1
				b, _ := stdjson.Marshal(v)
				delete(l.obj, "zz_unknown")
				want := "zz_unknown"
				if l.path != "" {
					want = l.path + ".zz_unknown"
				}
				r, e := Parse(kind, b)
				if e == nil && strings.HasSuffix(l.row, "chat_template_kwargs") {
					// Not a standard switch: the served model's template must read it.
					e = r.CheckTemplateSwitches(func(string) bool { return false })
				}
				switch {
				case e == nil:
					t.Errorf("%s body %d: an unknown field at %s passed", kind.Path(), bi, want)
				case e.Status != 400 || normPath(e.Param) != normPath(want):
					t.Errorf("%s body %d: unknown field at %s: %d param %q (%s)", kind.Path(), bi, want, e.Status, e.Param, e.Message)
				}
			}
		}
		for _, r := range FieldTable[kind] {
			if r.Verdict == Refused && r.Policy == "" {
				continue
			}
			p := strings.ReplaceAll(r.Path, "[]", "")
			if !seen[p] {
				t.Errorf("%s: no full body carries %s (%s)", kind.Path(), r.Path, r.Verdict)
			}
		}
	}
}

// TestFieldTableRefusedRows: every refused row, put where the table says, is a 400 naming it
// (or the object that holds it).
func TestFieldTableRefusedRows(t *testing.T) {
	for kind := Kind(0); kind < Kinds; kind++ {
		for _, row := range FieldTable[kind] {
			if row.Verdict != Refused || row.Policy != "" {
				continue
			}
			body, ok := placeRow(t, kind, row.Path)
			if !ok {
				t.Errorf("%s: no full body has a place for %s", kind.Path(), row.Path)
				continue
			}
			_, e := Parse(kind, body)
			if e == nil {
				t.Errorf("%s: refused row %s passed: %.300s", kind.Path(), row.Path, body)
				continue
			}
			rowNorm := normPath(variantRE.ReplaceAllString(strings.ReplaceAll(row.Path, "[]", ""), ""))
			if p := normPath(e.Param); e.Status != 400 || p == "" || !strings.HasPrefix(rowNorm, p) {
				t.Errorf("%s: refused row %s: %d param %q (%s)", kind.Path(), row.Path, e.Status, e.Param, e.Message)
			}
		}
	}
}

// placeRow puts path into the first full body of kind that holds its parent: a key set to a
// non-empty value, or a variant appended as an object of that type.
func placeRow(t *testing.T, kind Kind, path string) ([]byte, bool) {
	segs := strings.Split(strings.ReplaceAll(path, "[]", ""), ".")
	for _, body := range fullBodies[kind] {
		v := decodeAny(t, body)
		if place(v, segs) {
			b, _ := stdjson.Marshal(v)
			return b, true
		}
	}
	return nil, false
}

func place(v any, segs []string) bool {
	seg := segs[0]
	name, variant, hasVariant, _ := splitSegment(seg)
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			if place(e, segs) {
				return true
			}
		}
		return false
	case map[string]any:
		if len(segs) == 1 {
			if !hasVariant {
				x[name] = "x"
				return true
			}
			switch c := x[name].(type) {
			case []any:
				x[name] = append(c, map[string]any{"type": variant})
			case string:
				x[name] = []any{map[string]any{"type": variant}}
			default:
				return false
			}
			return true
		}
		child, ok := x[name]
		if !ok {
			return false
		}
		if hasVariant {
			// Only objects of that variant lead on.
			if arr, ok := child.([]any); ok {
				for _, e := range arr {
					if m, ok := e.(map[string]any); ok && typeOf(m) == variant && place(m, segs[1:]) {
						return true
					}
				}
			}
			return false
		}
		return place(child, segs[1:])
	}
	return false
}

// TestFieldTableIsWellFormed: every row builds (a parent row first, a reason for each refusal),
// and the top-level allow-lists are the table's.
func TestFieldTableIsWellFormed(t *testing.T) {
	for kind, rs := range FieldTable {
		if _, err := buildTree(rs); err != nil {
			t.Errorf("%s: %v", kind.Path(), err)
		}
		var names []string
		for _, r := range rs {
			if !strings.ContainsAny(r.Path, ".[") && (r.Verdict != Refused || r.Policy != "") {
				names = append(names, r.Path)
			}
		}
		sort.Strings(names)
		if got := sortedKeys(allowed[kind]); strings.Join(got, ",") != strings.Join(names, ",") {
			t.Errorf("%s: allow-list %v is not the table's %v", kind.Path(), got, names)
		}
	}
	if _, err := buildTree([]FieldRow{{Path: "a.b", Verdict: Inert}}); err == nil {
		t.Error("a row without its parent built")
	}
	if _, err := buildTree([]FieldRow{{Path: "a", Verdict: Refused}}); err == nil {
		t.Error("a refusal without a reason built")
	}
}

// TestNestedCheckAllocatesNothing: walking an accepted chat body's nested objects allocates
// nothing (the scanner's speed, issue 23).
func TestNestedCheckAllocatesNothing(t *testing.T) {
	body := []byte(fullBodies[Chat][0])
	r := mustParse(t, Chat, body)
	if n := testing.AllocsPerRun(100, func() {
		if e := checkNestedFields(Chat, r.Fields); e != nil {
			t.Fatal(e)
		}
	}); n != 0 {
		t.Errorf("%v allocations per check", n)
	}
}

func BenchmarkCheckNestedFields(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in one word."}],"max_tokens":8}`)
	r, e := Parse(Chat, body)
	if e != nil {
		b.Fatal(e)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if e := checkNestedFields(Chat, r.Fields); e != nil {
			b.Fatal(e)
		}
	}
}

func typeOf(m map[string]any) string {
	s, _ := m["type"].(string)
	return s
}
