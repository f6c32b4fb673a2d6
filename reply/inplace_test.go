package reply

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/request"
)

// The engine's own bytes reach the client only when every reader decodes them to what the
// scanner read: canonReader's verdict is checked against encoding/json and our decoder on the
// JSON seeds and on random mutations of reply-shaped values.
func TestCanonicalOnlyWhenEveryReaderAgrees(t *testing.T) {
	seeds := append([]string{
		`{"id":"x","choices":[{"index":0,"delta":{"content":"a\nb \"q\" \\ \/"}}]}`,
		`{"a":"é ñ 你好 😀","b":[1,-2.5e+3,true,false,null,{}],"c":{"d":[]}}`,
	}, jsonSeeds...)
	rnd := rand.New(rand.NewSource(23))
	var c canonReader
	check := func(in []byte) {
		if !c.read(in) {
			return
		}
		got, shadowed, err := DecodeStrict(in)
		if err != nil || len(shadowed) > 0 {
			t.Fatalf("%q: canonical, but our decoder says %v", in, err)
		}
		want, werr := stdDecode(in)
		if werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: canonical, but encoding/json reads %#v (%v), we read %#v", in, want, werr, got)
		}
		// Every string and key is what our decoder read, byte for byte (no escape, no U+FFFD).
		var texts []string
		for _, tk := range c.toks {
			if tk.kind == 's' || tk.kind == 'k' {
				texts = append(texts, string(c.text(tk, nil)))
			}
		}
		if w := stringsOf(got); strings.Join(w, "\x00") != strings.Join(sortStrings(texts), "\x00") {
			t.Fatalf("%q: in-place strings %q, decoded %q", in, texts, w)
		}
	}
	for _, s := range seeds {
		check([]byte(s))
		for range 300 {
			b := []byte(s)
			for range 1 + rnd.Intn(3) {
				if len(b) == 0 {
					break
				}
				i := rnd.Intn(len(b))
				switch rnd.Intn(3) {
				case 0:
					b[i] = "\"\\{}[],:u0189aeE-+. \x00\xff\xc3"[rnd.Intn(23)]
				case 1:
					b = append(b[:i], b[i+1:]...)
				default:
					b = append(b[:i], append([]byte{b[rnd.Intn(len(b))]}, b[i:]...)...)
				}
			}
			check(b)
		}
	}
}

// stringsOf lists every string and key of v (any order).
func stringsOf(v any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case string:
			out = append(out, t)
		case []any:
			for _, e := range t {
				walk(e)
			}
		case map[string]any:
			for k, e := range t {
				out = append(out, k)
				walk(e)
			}
		}
	}
	walk(v)
	return sortStrings(out)
}

func sortStrings(a []string) []string {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
	return a
}

// Each thing that makes bytes read differently across parsers forces the slow path: the client
// gets a value re-serialised from what was scanned (or, for a duplicate key or an aliased index,
// a refusal), never the engine's bytes.
func TestPassThroughOnlyWhenCanonical(t *testing.T) {
	sc, _ := testScope(t, request.Chat)
	chunk := func(content string) string {
		return `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + content + `"},"finish_reason":null}]}`
	}
	for _, c := range []struct {
		name, data string
		pass       bool // the engine's bytes as they are
		refused    bool
	}{
		{"canonical", chunk("Hello there"), true, false},
		{"data on two lines", strings.Replace(chunk("Hello"), `,"choices"`, ",\ndata: \"choices\"", 1), false, false},
		{"simple escapes", chunk(`line\nnext \"quoted\" \\ \/`), true, false},
		{"a \\u escape", chunk(`caf\u00e9`), false, false},
		{"a lone surrogate", chunk(`x\ud800y`), false, false},
		{"invalid UTF-8", chunk("bad \xff byte"), false, false},
		{"a duplicate key", `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}`, false, true},
		{"an aliased index", `{"object":"chat.completion.chunk","choices":[{"index":0.0,"delta":{"content":"a"}}]}`, false, true},
		{"an index as a string", `{"object":"chat.completion.chunk","choices":[{"index":"0","delta":{"content":"a"}}]}`, false, true},
		{"token ids", `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}],"output_ids":[1,2]}`, false, false},
		{"logprobs", `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.1,"bytes":[97]}]}}]}`, false, false},
	} {
		for _, fast := range []bool{true, false} {
			s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n")})
			s.noFast = !fast
			s.Write([]byte("data: " + c.data + "\n\n"))
			out := string(s.Pending())
			if c.refused {
				if out != "data: fail\n\n" || !s.Ended() {
					t.Fatalf("%s: %q, want a refusal", c.name, out)
				}
				continue
			}
			data := strings.TrimSuffix(strings.TrimPrefix(out, "data: "), "\n\n")
			if strings.ContainsAny(data, "\r\n") {
				t.Fatalf("%s: the client's event is not one data line: %q", c.name, out)
			}
			if passed := data == c.data || data == strings.ReplaceAll(c.data, "\ndata: ", "\n"); passed != (c.pass && fast) {
				t.Fatalf("%s (fast path allowed: %v): passed as it is = %v: %q", c.name, fast, passed, out)
			}
			v, _, err := DecodeStrict([]byte(data))
			if err != nil {
				t.Fatalf("%s: the client gets %q: %v", c.name, data, err)
			}
			if !c.pass && !bytes.Equal([]byte(data), CanonicalJSON(v)) {
				t.Fatalf("%s: %q is not re-serialised", c.name, data)
			}
		}
	}
	// Whole replies: the same rules.
	for _, c := range []struct {
		name, body string
		pass       bool
	}{
		{"canonical", `{"id":"r","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"you\"\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, true},
		{"a \\u escape", `{"choices":[{"index":0,"message":{"content":"caf\u00e9"}}]}`, false},
		{"invalid UTF-8", "{\"choices\":[{\"index\":0,\"message\":{\"content\":\"\xff\"}}]}", false},
		{"token ids", `{"text":"a","output_ids":[1,2]}`, false},
	} {
		for _, f := range []func(*Guard, []byte, []byte, *Charge) ([]byte, any, *Hit, error){Body, BodyUsage} {
			b := NewBudget(1 << 20)
			ch := b.NewCharge()
			out, _, _, err := f(NewGuard(sc), []byte("application/json"), []byte(c.body), ch)
			ch.Done()
			if err != nil {
				t.Fatalf("body %s: %v", c.name, err)
			}
			if passed := string(out) == c.body; passed != c.pass {
				t.Fatalf("body %s: passed as it is = %v: %q", c.name, passed, out)
			}
		}
	}
	for _, body := range []string{`{"a":1,"a":2}`, `{"choices":[{"index":-0,"message":{"content":"a"}}]}`} {
		for _, f := range []func(*Guard, []byte, []byte, *Charge) ([]byte, any, *Hit, error){Body, BodyUsage} {
			b := NewBudget(1 << 20)
			ch := b.NewCharge()
			if _, _, _, err := f(NewGuard(sc), nil, []byte(body), ch); err == nil || errors.Is(err, ErrLeak) {
				t.Fatalf("body %s: %v, want a refusal", body, err)
			}
			ch.Done()
		}
	}
}

// What the client decodes is the same whether an event took the fast path or the slow one, and
// the scanners reach the same verdicts: random chat, Responses and Anthropic streams, with the
// requester's own marker and stretches of another tenant's in their text, through two streams.
func TestFastPathMatchesSlowPath(t *testing.T) {
	sc, victim := testScope(t, request.Chat)
	own, _ := sc.Keyring.Current("alice", time.Now())
	rnd := rand.New(rand.NewSource(7))
	words := []string{"the", "KV", "cache", "KVG-", "K", "finish_reason", own[:9], own[9:], victim[4:12], victim[12:20], "é", "\\n", `\"`, "ok"}
	totalPassed, leaks, changed := 0, 0, 0
	for iter := 0; iter < 400; iter++ {
		kind := []request.Kind{request.Chat, request.Responses, request.Messages}[rnd.Intn(3)]
		sc.Kind = kind
		var events []string
		for range 1 + rnd.Intn(10) {
			text := ""
			for range 1 + rnd.Intn(4) {
				text += words[rnd.Intn(len(words))]
			}
			switch kind {
			case request.Chat:
				events = append(events, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`+text+`"},"finish_reason":null}]}`+"\n\n")
			case request.Responses:
				events = append(events, "event: response.output_text.delta\n"+`data: {"type":"response.output_text.delta","delta":"`+text+`","output_index":0,"content_index":0}`+"\n\n")
			default:
				events = append(events, "event: content_block_delta\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+text+`"}}`+"\n\n")
			}
		}
		run := func(fast bool) (out []any, ended bool, leak bool) {
			passed := 0
			defer func() { totalPassed += passed }()
			s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n"),
				Sink: funcSink{passed: func(bool) { passed++ }}})
			s.noFast = !fast
			for _, ev := range events {
				s.Write([]byte(ev))
			}
			s.End()
			for _, ev := range strings.Split(string(s.Pending()), "\n\n") {
				for _, line := range strings.Split(ev, "\n") {
					if d, ok := strings.CutPrefix(line, "data: "); ok {
						v, _, err := DecodeStrict([]byte(d))
						if err != nil {
							v = d
						}
						out = append(out, v)
					}
				}
			}
			if !fast && passed > 0 {
				t.Fatalf("slow stream passed %d events", passed)
			}
			return out, s.Ended(), s.Leak() != nil
		}
		a, ae, al := run(true)
		b, be, bl := run(false)
		if !reflect.DeepEqual(a, b) || ae != be || al != bl {
			t.Fatalf("iter %d %v: fast path %v (ended %v leak %v)\nslow path %v (ended %v leak %v)\nevents %q", iter, kind, a, ae, al, b, be, bl, events)
		}
		if al {
			leaks++
		}
		if strings.Contains(fmt.Sprint(events), own[:9]) {
			changed++
		}
	}
	// Both paths were taken, some streams were cut and some carried the requester's own marker.
	if totalPassed == 0 || leaks == 0 || leaks == 400 || changed == 0 {
		t.Fatalf("passed %d events on the fast path, %d leaks, %d streams with the own marker", totalPassed, leaks, changed)
	}
	t.Logf("%d events passed in place, %d of 400 streams cut", totalPassed, leaks)
}

// carriesText read in place is backends.CarriesText of the decoded event.
func TestCarriesTextInPlace(t *testing.T) {
	for _, ev := range []string{
		`{"choices":[{"index":0,"delta":{"content":"a"}}]}`, `{"choices":[{"index":0,"delta":{"content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"role":"assistant"}}]}`, `{"choices":[{"index":0,"delta":{"reasoning_content":"r"}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`, `{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}`,
		`{"choices":[{"index":0,"text":"t"}]}`, `{"choices":[]}`, `{"choices":[1,{"index":1,"text":"x"}]}`, `{"choices":{}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`,
		`{"type":"content_block_delta","delta":{"thinking":"t"}}`, `{"type":"content_block_start","index":0}`,
		`{"type":"response.output_text.delta","delta":"x"}`, `{"type":"response.output_text.delta","delta":""}`,
		`{"type":"","text":"x"}`, `{"type":1,"text":"x"}`, `{"text":"x"}`, `{"text":""}`, `{"ping":true}`,
	} {
		var c canonReader
		if !c.read([]byte(ev)) || !fastEligible(&c, nil, "") {
			t.Fatalf("%s: not canonical, or not eligible", ev)
		}
		v, _, _ := DecodeStrict([]byte(ev))
		if got, want := c.carriesText(), backends.CarriesText(v); got != want {
			t.Errorf("%s: in place %v, backends.CarriesText %v", ev, got, want)
		}
	}
}

// The keys the fast path leaves to the slow one are exactly those walk treats specially.
func TestFastPathRefusesWithheldKeys(t *testing.T) {
	if len(replyIDFields) != 1 || !replyIDFields[replyIDField] {
		t.Fatalf("replyIDFields %v: fastEligible compares with %q only", replyIDFields, replyIDField)
	}
	sc, _ := testScope(t, request.Chat)
	gd := NewGuard(sc)
	for _, key := range []string{replyIDField, "output_token_logprobs", "input_top_logprobs", "logprobs", "top_logprobs"} {
		ev := fmt.Sprintf(`{"object":"x","choices":[{"index":0,"%s":[[1,2]]}]}`, key)
		var c canonReader
		if !c.read([]byte(ev)) || fastEligible(&c, gd, "") {
			t.Errorf("%s: fast path eligible", key)
		}
	}
	var c canonReader
	if ev := `{"object":"x","choices":[{"index":0,"logprobs":null}],"usage":null}`; !c.read([]byte(ev)) || !fastEligible(&c, gd, "") {
		t.Errorf("null logprobs and usage: not eligible")
	}
	if b, _ := json.Marshal(map[string]any{"usage": map[string]any{"prompt_tokens": 1}}); !c.read(b) || fastEligible(&c, gd, "") {
		t.Errorf("a usage section: eligible")
	}
}

// A whole reply scanned in place (BodyUsage) reaches the same verdict as the decoding path
// (Body), the client decodes the same value from either output, and usage reads the same.
func TestBodyInPlaceMatchesDecoding(t *testing.T) {
	sc, victim := testScope(t, request.Chat)
	own, _ := sc.Keyring.Current("alice", time.Now())
	rnd := rand.New(rand.NewSource(11))
	words := []string{"the", "KV", "cache", "KVG-", "K", own[:9], own[9:], victim[4:12], victim[12:20], "é", `\n`, `\"`, `\u00e9`, "ok"}
	text := func() string {
		s := ""
		for range 1 + rnd.Intn(5) {
			s += words[rnd.Intn(len(words))]
		}
		return s
	}
	passed, leaks := 0, 0
	for iter := 0; iter < 600; iter++ {
		var body string
		switch rnd.Intn(4) {
		case 0:
			body = `{"id":"r","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + text() + `","reasoning_content":"` + text() + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
		case 1:
			body = `{"type":"message","role":"assistant","content":[{"type":"text","text":"` + text() + `"},{"type":"text","text":"` + text() + `"}],"usage":{"input_tokens":4,"output_tokens":7}}`
		case 2:
			body = `{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"` + text() + `"}]}],"usage":{"input_tokens":1,"output_tokens":2}}`
		default:
			body = `{"text":"` + text() + `","meta_info":{"id":"x","prompt_tokens":9,"completion_tokens":4},"index":0}`
		}
		run := func(inPlace bool) (out []byte, v any, err error) {
			b := NewBudget(1 << 20)
			ch := b.NewCharge()
			defer ch.Done()
			f := Body
			if inPlace {
				f = BodyUsage
			}
			out, v, _, err = f(NewGuard(sc), []byte("application/json"), []byte(body), ch)
			return append([]byte(nil), out...), v, err
		}
		ao, av, ae := run(true)
		bo, bv, be := run(false)
		if !errors.Is(ae, be) && (ae == nil) != (be == nil) {
			t.Fatalf("%s: in place %v, decoding %v", body, ae, be)
		}
		if be != nil {
			if errors.Is(be, ErrLeak) {
				leaks++
			}
			continue
		}
		a, _, _ := DecodeStrict(ao)
		b, _, _ := DecodeStrict(bo)
		if strings.Contains(body, victim[4:12]) || strings.Contains(body, victim[12:20]) {
			// What the joined reading withholds depends on the order it reads the values in
			// (the decoding path reads a map's in Go's random order): each output is held to
			// the bound instead.
			if n := canary.LongestRun(string(ao), victim); n > canary.HoldMin-1 {
				t.Fatalf("%s: %d characters of the marker passed in place: %s", body, n, ao)
			}
		} else if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s:\nin place %s\ndecoding %s", body, ao, bo)
		}
		if ra, rb := backends.ReadUsage(av), backends.ReadUsage(bv); !reflect.DeepEqual(ra, rb) {
			t.Fatalf("%s: usage in place %v, decoding %v", body, ra, rb)
		}
		if string(ao) == body {
			passed++
		}
	}
	if passed == 0 || leaks == 0 {
		t.Fatalf("%d bodies passed as they came, %d leaks", passed, leaks)
	}
	t.Logf("%d of 600 bodies passed as they came, %d leaks", passed, leaks)
}
