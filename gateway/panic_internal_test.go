package gateway

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/tokenize"
)

// boomEncoder panics on prompts that contain "BOOM", as a bug in counting would.
type boomEncoder struct{ tokenize.Encoder }

func (b boomEncoder) Count(text string, stopAfter int) (int, bool) {
	if strings.Contains(text, "BOOM") {
		panic("counting bug")
	}
	return b.Encoder.Count(text, stopAfter)
}

// panicOnce panics on its first observation (a stream read), then observes nothing.
type panicOnce struct{ fired atomic.Bool }

func (p *panicOnce) Observe(float64) {
	if !p.fired.Swap(true) {
		panic("stream bug")
	}
}

// A panic in one exchange (while counting, or while relaying a stream on fasthttp's connection
// goroutine where nothing else recovers) answers that request with a 500 in its envelope, is
// counted, and leaves every other request served by the same process.
func TestPanicInOneExchangeLeavesOthersServed(t *testing.T) {
	g := inmemGateway(t, enginesim.Config{})
	g.count.Encoder = boomEncoder{g.count.Encoder}
	stream := &panicOnce{}
	g.metrics.overheadStream = stream
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() { _ = g.server.Shutdown() })
	url := "http://" + ln.Addr().String()
	before := panicCount("request")
	send := func(path, body string) (int, string) {
		req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Big enough that the byte bound does not admit it, so the encoder runs.
	boom := `{"model":"sim","messages":[{"role":"user","content":"BOOM ` + strings.Repeat("word ", 9000) + `"}],"max_tokens":4}`
	ok := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`
	var wg sync.WaitGroup
	var served, failed atomic.Int32
	for i := 0; i < 8; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			code, body := send("/v1/chat/completions", boom)
			if code != 500 || !strings.Contains(body, `"code":"internal_error"`) {
				t.Errorf("panicking request: %d %s", code, body)
			}
			failed.Add(1)
		}()
		go func() {
			defer wg.Done()
			if code, body := send("/v1/chat/completions", ok); code != 200 {
				t.Errorf("ordinary request beside a panic: %d %s", code, body)
				return
			}
			served.Add(1)
		}()
	}
	wg.Wait()
	if served.Load() != 8 || failed.Load() != 8 {
		t.Fatalf("served %d, failed %d", served.Load(), failed.Load())
	}
	if got := panicCount("request") - before; got != 8 {
		t.Fatalf("kvgate_panics_total{where=request} rose by %v, want 8", got)
	}
	// The Anthropic route answers in its own envelope.
	code, body := send("/v1/messages", `{"model":"sim","max_tokens":4,"messages":[{"role":"user","content":"BOOM `+strings.Repeat("word ", 9000)+`"}]}`)
	if code != 500 || !strings.Contains(body, `"type":"error"`) || !strings.Contains(body, `"api_error"`) {
		t.Fatalf("anthropic envelope: %d %s", code, body)
	}
	// A panic in the stream relay: the client gets an error event, the next stream is whole.
	streamBody := `{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":4,"stream":true}`
	code, body = send("/v1/chat/completions", streamBody)
	if code != 200 || !strings.Contains(body, `"internal_error"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("panicking stream: %d %q", code, body)
	}
	code, body = send("/v1/chat/completions", streamBody)
	if code != 200 || strings.Contains(body, "error") || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream after a panicking one: %d %q", code, body)
	}
	if n := inflightTokens(g); n != 0 {
		t.Fatalf("in-flight tokens %d after every exchange ended: a panic leaked its accounting", n)
	}
}

func inflightTokens(g *Gateway) int64 {
	var n int64
	for _, b := range g.backends.All() {
		n += b.Inflight()
	}
	return n
}

func panicCount(where string) float64 {
	var m dto.Metric
	_ = panics.Total.WithLabelValues(where).Write(&m)
	return m.GetCounter().GetValue()
}
