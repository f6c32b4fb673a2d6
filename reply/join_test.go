package reply

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tests/markerhour"
)

func testScope(t *testing.T, kind request.Kind) (Scope, string) {
	t.Helper()
	kr := markerhour.Keyring("join test secret", "alice", "bob") // the pinned hour's markers
	victim, _ := kr.Current("bob", time.Now())
	return Scope{Keyring: kr, Requester: "alice", Kind: kind}, victim
}

func wholeBody(t *testing.T, sc Scope, body string) error {
	t.Helper()
	b := NewBudget(64 << 20)
	c := b.NewCharge()
	defer c.Done()
	_, _, _, err := Body(NewGuard(sc), []byte("application/json"), []byte(body), c)
	return err
}

// Values that clients join are scanned joined: a foreign marker split across Anthropic text
// blocks, Responses output_text parts or output items, or two choices, is a leak, though no one
// value holds 8 of its characters.
func TestSplitAcrossJoinedValuesIsALeak(t *testing.T) {
	sc, m := testScope(t, request.Messages)
	a, b, c := m[:3], m[3:11], m[11:]
	for name, body := range map[string]string{
		"anthropic blocks": `{"type":"message","role":"assistant","content":[{"type":"text","text":"` + a + `"},{"type":"text","text":"` + b + `"},{"type":"text","text":"` + c + `"}]}`,
		"responses parts":  `{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"` + a + `"},{"type":"output_text","text":"` + b + c + `"}]}]}`,
		"responses items":  `{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"` + a + b + `"}]},{"type":"message","content":[{"type":"output_text","text":"` + c + `"}]}]}`,
		"two choices":      `{"object":"chat.completion","choices":[{"index":0,"message":{"content":"` + a + b + `"}},{"index":1,"message":{"content":"` + c + `"}}]}`,
	} {
		if err := wholeBody(t, sc, body); !errors.Is(err, ErrLeak) {
			t.Errorf("%s: %v, want a leak", name, err)
		}
	}
	// The same values without the split marker pass, unchanged in number.
	clean := `{"type":"message","content":[{"type":"text","text":"Hello "},{"type":"text","text":"world"}]}`
	if err := wholeBody(t, sc, clean); err != nil {
		t.Fatalf("clean blocks: %v", err)
	}
}

// In a stream, a marker split across two fields (content, then reasoning) or two choices is
// cut before the client has more than 7 of its characters in any one place.
func TestStreamSplitAcrossFieldsIsCut(t *testing.T) {
	sc, m := testScope(t, request.Chat)
	cut := 0
	s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, Sink: funcSink{leak: func() { cut++ }},
		FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n")})
	ev := func(field, text string, idx int) string {
		return `data: {"object":"chat.completion.chunk","choices":[{"index":` + string(rune('0'+idx)) + `,"delta":{"` + field + `":"` + text + `"}}]}` + "\n\n"
	}
	s.Write([]byte(ev("content", m[:7], 0) + ev("reasoning_content", m[7:14], 0) + ev("content", m[14:], 1)))
	s.End()
	out := string(s.Pending())
	if cut != 1 || !strings.HasSuffix(out, "data: cut\n\n") {
		t.Fatalf("cut %d times; stream %q", cut, out)
	}
	if strings.Contains(out, m[4:12]) {
		t.Fatalf("8 marker characters reached the client: %q", out)
	}
}

// Indexes are canonical non-negative JSON integers: 0.0, -0, 0e0, "0", 01 and null alias index 0
// in JavaScript clients, so a reply spelling one is refused as malformed (not a leak), whole or
// streamed.
func TestAliasedIndexRefused(t *testing.T) {
	sc, _ := testScope(t, request.Chat)
	for _, idx := range []string{`0.0`, `-0`, `0e0`, `"0"`, `null`, `1.5`, `-1`, `1e9`, `10000000000`} {
		body := `{"object":"chat.completion","choices":[{"index":` + idx + `,"message":{"content":"hi"}}]}`
		if err := wholeBody(t, sc, body); !errors.Is(err, ErrMalformed) {
			t.Errorf("whole, index %s: %v", idx, err)
		}
		tool := `{"object":"chat.completion","choices":[{"index":0,"message":{"tool_calls":[{"index":` + idx + `,"function":{"name":"f"}}]}}]}`
		if err := wholeBody(t, sc, tool); !errors.Is(err, ErrMalformed) {
			t.Errorf("whole tool call, index %s: %v", idx, err)
		}
		leaks := 0
		s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, Sink: funcSink{leak: func() { leaks++ }},
			FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n")})
		s.Write([]byte(`data: {"choices":[{"index":` + idx + `,"delta":{"content":"hi"}}]}` + "\n\n"))
		if out := string(s.Pending()); leaks != 0 || out != "data: fail\n\n" || !s.Ended() {
			t.Errorf("stream, index %s: leaks %d, %q", idx, leaks, out)
		}
	}
	for _, idx := range []string{`0`, `7`, `123456789`} {
		body := `{"object":"chat.completion","choices":[{"index":` + idx + `,"message":{"content":"hi"}}]}`
		if err := wholeBody(t, sc, body); err != nil {
			t.Errorf("canonical index %s refused: %v", idx, err)
		}
	}
}

// Token ids in SGLang's logprob tuples are withheld (null) while canaries are on: a client with
// the vocabulary could decode them into text the scanner never saw. Logprobs and texts stay.
func TestLogprobTupleIDsWithheld(t *testing.T) {
	sc, _ := testScope(t, request.Generate)
	b := NewBudget(64 << 20)
	c := b.NewCharge()
	defer c.Done()
	body := `{"text":"hi","output_ids":[5,6],"meta_info":{"id":"x","output_token_logprobs":[[-0.5,5,"h"],[-0.1,6,null]],` +
		`"output_top_logprobs":[[[-0.5,5,"h"],[-1.5,9,"j"]],null],"input_token_logprobs":[[null,1],[-2.0,7]],"prompt_tokens":2}}`
	out, _, _, err := Body(NewGuard(sc), nil, []byte(body), c)
	if err != nil {
		t.Fatal(err)
	}
	want := `"output_token_logprobs":[[-0.5,null,"h"],[-0.1,null,null]]`
	if got := string(out); !strings.Contains(got, want) || !strings.Contains(got, `[[[-0.5,null,"h"],[-1.5,null,"j"]],null]`) ||
		!strings.Contains(got, `"input_token_logprobs":[[null,null],[-2.0,null]]`) || strings.Contains(got, "output_ids") {
		t.Fatalf("ids not withheld: %s", got)
	}
}

// The requester's own marker split across values a client joins (Anthropic text blocks, whole or
// streamed, Responses output parts and items) reaches it without "KVG-" at every split of the
// prefix and the first characters, and it is no leak: the joined prefix scanner strips it.
func TestOwnMarkerAcrossJoinedValues(t *testing.T) {
	kr := markerhour.Keyring("own across values", "alice", "bob")
	own, _ := kr.Current("alice", time.Now())
	rnd := rand.New(rand.NewSource(3))
	for _, kind := range []request.Kind{request.Messages, request.Responses, request.Chat, request.Completions} {
		for _, stream := range []bool{false, true} {
			for cut := 1; cut < 14; cut++ {
				for _, cut2 := range []int{0, cut + 1 + rnd.Intn(len(own)-cut-1)} {
					text := "see " + own + " there"
					pieces := []string{text[:4+cut], text[4+cut:]}
					if cut2 > 0 {
						pieces = []string{text[:4+cut], text[4+cut : 4+cut2], text[4+cut2:]}
					}
					sc := Scope{Keyring: kr, Requester: "alice", Kind: kind}
					got, leak := runPath(t, rnd, sc, kind, pieces, stream)
					if leak || strings.Contains(got, canary.MarkerPrefix) {
						t.Fatalf("%v stream=%v %q: leak=%v, the client assembled %q", kind, stream, pieces, leak, got)
					}
					if !strings.HasPrefix(got, "see ") || !strings.HasSuffix(got, " there") {
						t.Fatalf("%v stream=%v %q: the text around the marker was lost: %q", kind, stream, pieces, got)
					}
				}
			}
		}
	}
}
