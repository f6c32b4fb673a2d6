package reply

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/request"
)

// A run from the middle or the end of a foreign marker (no "KVG-", not its first characters) is
// a leak: a stream carrying the marker's last 13 characters over three deltas is cut before the
// client has LooseMin of them, and a whole body with its last 19 or a middle 13 is refused.
func TestStreamedMarkerSuffixIsCut(t *testing.T) {
	sc, m := testScope(t, request.Chat)
	tail := m[len(m)-13:]
	cut := 0
	s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, Sink: funcSink{leak: func() { cut++ }},
		FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n")})
	ev := func(text string) string {
		return `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + text + `"}}]}` + "\n\n"
	}
	s.Write([]byte(ev("The page said: ") + ev(tail[:5]) + ev(tail[5:10]) + ev(tail[10:]+" and more.")))
	s.End()
	out := string(s.Pending())
	if cut != 1 || !strings.HasSuffix(out, "data: cut\n\n") {
		t.Fatalf("cut %d times; stream %q", cut, out)
	}
	// What the client assembles: the content deltas joined.
	var joined strings.Builder
	for _, part := range strings.Split(out, `"content":"`)[1:] {
		joined.WriteString(part[:strings.IndexByte(part, '"')])
	}
	if got := joined.String(); strings.Contains(got, tail[:canary.LooseMin]) || strings.Contains(got, "and more") {
		t.Fatalf("the run reached the client: %q", got)
	}
	for name, run := range map[string]string{"last 19": m[len(m)-19:], "middle 13": m[7:20]} {
		body := `{"object":"chat.completion","choices":[{"index":0,"message":{"content":"see ` + strings.ToUpper(run) + ` here"}}]}`
		if err := wholeBody(t, sc, body); !errors.Is(err, ErrLeak) {
			t.Errorf("%s: %v, want a leak", name, err)
		}
	}
}
