package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAuditJudge(t *testing.T) {
	timeout := result{err: errors.New("deadline"), timeout: true}
	reset := result{err: errors.New("connection reset")}
	st := func(code int) result { return result{status: code} }
	streamErr := result{status: 200, streamError: "boom"}
	cases := []struct {
		name          string
		tokens, limit int
		strict, exact bool
		res           result
		want          string
		detail        string // substring
	}{
		{"over refused", 101, 100, true, true, st(413), Pass, ""},
		{"over 400", 100, 100, true, true, st(400), Pass, ""},
		{"over admitted", 101, 100, true, true, st(200), Fail, "was admitted"},
		{"over admitted, error event", 150, 100, true, true, streamErr, Fail, "was admitted"},
		{"over 5xx", 101, 100, true, true, st(502), Fail, "HTTP 502"},
		{"over hang", 101, 100, true, true, timeout, Fail, "not hang"},
		{"over reset", 101, 100, true, true, reset, Fail, "transport error"},
		{"over 429", 101, 100, true, true, st(429), Warn, "rate-limited"},
		{"at non-strict limit admitted", 100, 100, false, true, st(200), Pass, "largest prompt it admits"},
		{"at non-strict limit refused", 100, 100, false, true, st(413), Pass, ""},
		{"just over, estimated, admitted", 101, 100, true, false, st(200), Warn, "estimate"},
		{"far over, estimated, admitted", 200, 100, true, false, st(200), Fail, "was admitted"},
		{"over 401 is no size refusal", 101, 100, true, true, st(401), Warn, "--api-key"},
		{"over 404 is no size refusal", 101, 100, true, true, st(404), Warn, "--native"},
		{"under admitted", 99, 100, true, true, st(200), Pass, ""},
		{"under refused", 99, 100, true, true, st(413), Warn, "under the limit"},
		{"under error event", 99, 100, true, true, streamErr, Warn, "inside the stream"},
		{"under 5xx", 99, 100, true, true, st(500), Fail, "HTTP 500"},
		{"under hang", 99, 100, true, true, timeout, Fail, "timeout"},
	}
	for _, c := range cases {
		v, d := judge(c.tokens, c.limit, c.strict, c.exact, c.res)
		if v != c.want || !strings.Contains(d, c.detail) {
			t.Errorf("%s: got %s %q, want %s containing %q", c.name, v, d, c.want, c.detail)
		}
	}
}

func TestAuditFindMarkers(t *testing.T) {
	a, b, c := newMarker(), newMarker(), newMarker()
	if len(a) != len(markerPrefix)+markerLen || a == b {
		t.Fatalf("markers %q %q", a, b)
	}
	text := "x " + b + " y " + a + " " + b + " and " + c[:len(markerPrefix)+minFragment] + " but " + a[:len(markerPrefix)+minFragment-1]
	got := findMarkers(text, []string{a, b, c})
	if strings.Join(got, ",") != strings.Join([]string{b, a, c}, ",") {
		t.Fatalf("want b, a (whole) and c (an 8-character fragment), in order, once each: %q", got)
	}
	if got := findMarkers(a[:len(a)-9]+" "+newMarker(), []string{a}); len(got) != 0 {
		t.Fatalf("a 7-character fragment and an unknown marker are no leak: %q", got)
	}
	if e := excerpt("before "+a+" after", a); !strings.Contains(e, a) || !strings.HasPrefix(e, "before") {
		t.Fatalf("excerpt %q", e)
	}
}

// A marker split over many OpenAI deltas is found only in the reassembled text; a native stream
// repeats the text so far, so the longest event is the text.
func TestAuditParseSSE(t *testing.T) {
	m := newMarker()
	var b strings.Builder
	for i := 0; i < len(m); i += 3 {
		piece, _ := json.Marshal(m[i:min(i+3, len(m))])
		fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"text\":%s}]}\n\n", piece)
	}
	b.WriteString("data: [DONE]\n\n")
	if bytes.Contains([]byte(b.String()), []byte(m)) {
		t.Fatal("the test stream should split the marker")
	}
	if text, e := parseSSE([]byte(b.String()), false); text != m || e != "" {
		t.Fatalf("openai: %q %q", text, e)
	}
	native := "data: {\"text\":\"a\"}\n\ndata: {\"text\":\"ab\"}\n\ndata: {\"text\":\"abc\"}\n\ndata: [DONE]\n\n"
	if text, _ := parseSSE([]byte(native), true); text != "abc" {
		t.Fatalf("native: %q", text)
	}
	chat := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"error\":{\"message\":\"cut\",\"code\":502}}\n\ndata: [DONE]\n\n"
	if text, e := parseSSE([]byte(chat), false); text != "hi" || e != "cut" {
		t.Fatalf("chat: %q %q", text, e)
	}
}

// fakeEngine is an OpenAI-compatible endpoint counting one token per fillerUnit (so the
// audit's estimate is exact for it). refuseAt ≤ 0 admits everything.
type fakeEngine struct {
	models   string // body of /v1/models
	refuseAt int
	hangAt   int // prompts of at least this many tokens get no reply until the client gives up
	inFlight atomic.Int32
	maxIn    atomic.Int32
	mu       sync.Mutex
	paths    map[string]int
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	if f.paths == nil {
		f.paths = map[string]int{}
	}
	f.paths[r.URL.Path]++
	f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/models":
		w.Write([]byte(f.models))
	case "/v1/completions":
		n := f.inFlight.Add(1)
		defer f.inFlight.Add(-1)
		for {
			m := f.maxIn.Load()
			if n <= m || f.maxIn.CompareAndSwap(m, n) {
				break
			}
		}
		var req struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		tokens := strings.Count(req.Prompt, fillerUnit)
		time.Sleep(5 * time.Millisecond) // long enough for concurrent requests to overlap
		if f.hangAt > 0 && tokens >= f.hangAt {
			<-r.Context().Done()
			return
		}
		if f.refuseAt > 0 && tokens >= f.refuseAt {
			w.WriteHeader(400)
			w.Write([]byte(`{"object":"error","message":"too long","code":400}`))
			return
		}
		w.Write([]byte(`{"choices":[{"index":0,"text":"ok"}]}`))
	default:
		http.NotFound(w, r)
	}
}

func startFake(t *testing.T, f *fakeEngine) string {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestAuditNoDiscoverableLimitNamesFlag(t *testing.T) {
	f := &fakeEngine{models: `{"object":"list","data":[{"id":"m"}]}`, refuseAt: 100}
	url := startFake(t, f)
	r := Run(context.Background(), Options{Target: url})
	if r.ExitCode != ExitUnauditable || !strings.Contains(r.Error, "--limit N") {
		t.Fatalf("want exit 2 naming --limit: %d %q", r.ExitCode, r.Error)
	}
	var buf bytes.Buffer
	_ = r.WriteJSON(&buf)
	if !bytes.Contains(buf.Bytes(), []byte(`"findings": []`)) || !bytes.Contains(buf.Bytes(), []byte(`"exit_code": 2`)) {
		t.Fatalf("an unaudited report still has the documented shape:\n%s", buf.Bytes())
	}

	// With the limit given, the same target is audited: it refuses at 100, so everything passes,
	// and requests go one at a time by default.
	r = Run(context.Background(), Options{Target: url, Limit: 100, Warmups: -1, NoSalts: true})
	if r.ExitCode != ExitPass || r.Sizing != SizingEstimate || r.LimitSource != "--limit" {
		t.Fatalf("exit %d sizing %s source %s: %+v", r.ExitCode, r.Sizing, r.LimitSource, r.Findings)
	}
	if got := f.maxIn.Load(); got != 1 {
		t.Fatalf("default concurrency is 1, saw %d requests at once", got)
	}
	if f.paths["/v1/completions"] != 8 { // limit-1, limit, limit+1, far-over; each both ways
		t.Fatalf("generation requests: %v", f.paths)
	}
}

func TestAuditConcurrencyBound(t *testing.T) {
	f := &fakeEngine{models: `{"data":[{"id":"m","max_model_len":200}]}`, refuseAt: 200}
	r := Run(context.Background(), Options{Target: startFake(t, f), Concurrency: 3, Warmups: 4})
	if r.ExitCode != ExitPass {
		t.Fatalf("exit %d: %+v", r.ExitCode, r.Findings)
	}
	if got := f.maxIn.Load(); got > 3 || got < 2 {
		t.Fatalf("--concurrency 3: saw %d requests at once", got)
	}
}

// An over-limit prompt that hangs is a failure found within the per-request timeout.
func TestAuditHangIsAFailureWithinTimeout(t *testing.T) {
	f := &fakeEngine{models: `{"data":[{"id":"m","max_model_len":100}]}`, hangAt: 101}
	start := time.Now()
	r := Run(context.Background(), Options{Target: startFake(t, f), Timeout: 200 * time.Millisecond, Warmups: -1})
	if r.ExitCode != ExitFindings {
		t.Fatalf("exit %d: %+v", r.ExitCode, r.Findings)
	}
	hung := 0
	for _, f := range r.Findings {
		if f.Got == "timeout" && f.Verdict == Fail {
			hung++
		}
	}
	if hung != 4 { // limit+1 and far-over, both ways
		t.Fatalf("want 4 timeouts, got %d: %+v", hung, r.Findings)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("took %v", time.Since(start))
	}
}

// The budget skips what it cannot afford, says so, and is never passed.
func TestAuditBudget(t *testing.T) {
	f := &fakeEngine{models: `{"data":[{"id":"m","max_model_len":1000}]}`, refuseAt: 1000}
	r := Run(context.Background(), Options{Target: startFake(t, f), Budget: 2500, Warmups: -1})
	if r.TokensSent > 2500 || r.TokensSent == 0 {
		t.Fatalf("tokens sent %d of 2500", r.TokensSent)
	}
	skipped := 0
	for _, f := range r.Findings {
		if f.Got == "not sent" {
			skipped++
			if f.Verdict != Warn || !strings.Contains(f.Detail, "--budget") {
				t.Fatalf("a skipped probe is a warning naming --budget: %+v", f)
			}
		}
	}
	if skipped == 0 || r.ExitCode != ExitPass {
		t.Fatalf("want skipped probes and exit 0: %+v", r.Findings)
	}
}

func TestAuditOptionsRefused(t *testing.T) {
	for _, o := range []Options{
		{},
		{Target: "http://127.0.0.1:1", Prefill: "http://127.0.0.1:2"},
		{Prefill: "http://127.0.0.1:2"},
		{Target: "127.0.0.1:8080"},
	} {
		if r := Run(context.Background(), o); r.ExitCode != ExitUnauditable || r.Error == "" {
			t.Errorf("%+v: want exit 2 with an error, got %d", o, r.ExitCode)
		}
	}
}
