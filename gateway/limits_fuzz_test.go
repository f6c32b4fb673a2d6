package gateway

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/limits"
)

// engineScript is what the fake engine answers: its capacity, its load, and its reply to any
// generation or utility request.
type engineScript struct {
	info, models, loads []byte
	status              int
	stream              bool
	reply               []byte
}

var saneEngine = engineScript{
	info:   []byte(`{"max_total_num_tokens":65536,"max_req_input_len":32000,"page_size":16,"disaggregation_mode":"null"}`),
	models: []byte(`{"object":"list","data":[{"id":"sim","max_model_len":32768}]}`),
	loads:  []byte(`{"loads":[{"num_used_tokens":0}]}`),
	status: 200,
	reply:  []byte(`{"text":"ok","meta_info":{"id":"r","prompt_tokens":3,"completion_tokens":1,"finish_reason":{"type":"length","length":1}}}`),
}

// scriptedEngine serves *script on loopback (in this process); everything else is a 404, as
// an engine without that route (e.g. /tokenize: calibration and exact counts fall back).
func scriptedEngine(tb testing.TB, script *atomic.Pointer[engineScript]) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		s := script.Load()
		ctx.SetContentType("application/json")
		switch p := string(ctx.Path()); p {
		case "/server_info":
			ctx.SetBody(s.info)
		case "/v1/models":
			ctx.SetBody(s.models)
		case "/v1/loads":
			ctx.SetBody(s.loads)
		case "/abort_request":
			ctx.SetBodyString(`{}`)
		case "/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
			"/v1/tokenize", "/v1/messages/count_tokens":
			ctx.SetStatusCode(s.status)
			if s.stream {
				ctx.SetContentType("text/event-stream")
			}
			ctx.SetBody(s.reply)
		default:
			ctx.SetStatusCode(404)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// limitsFuzzGateway is a gateway (tenant alice, key "k", every limit on, canaries on) in front
// of a scripted engine; it polls only when told to.
func limitsFuzzGateway(tb testing.TB, script *atomic.Pointer[engineScript]) (*Gateway, *backends.Set) {
	tb.Helper()
	url := scriptedEngine(tb, script)
	// tpm so large that no reading refuses the next request by itself: max_concurrent 1 is what
	// proves the hostile exchange gave its slot back.
	return gatewayFor(tb, `
backends: [{name: eng, url: "`+url+`", role: unified}]
tenants: [{name: alice, key_sha256: "`+config.SHA256Hex("k")+`", rpm: 1000000, tpm: 1000000000, max_concurrent: 1}]
canary: {enabled: true, secret: "limits fuzz secret, padded to 32 bytes"}
capacity: {poll_interval: 1h}
`)
}

// panicsTotal is kvgate_panics_total over every place: a recovered panic is still a bug.
func panicsTotal() float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { panics.Total.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var d dto.Metric
		_ = m.Write(&d)
		sum += d.GetCounter().GetValue()
	}
	return sum
}

// fuzzRoutes are the routes a hostile reply is fed through, with a valid request for each.
var fuzzRoutes = []struct{ path, body string }{
	{"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":8%s}`},
	{"/v1/completions", `{"model":"sim","prompt":"hi","max_tokens":8%s}`},
	{"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":8}%s}`},
	{"/v1/responses", `{"model":"sim","input":"hi","max_output_tokens":8%s}`},
	{"/v1/messages", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":8%s}`},
	{"/v1/tokenize", `{"model":"sim","prompt":"hi"}`},
	{"/v1/messages/count_tokens", `{"model":"sim","messages":[{"role":"user","content":"hi"}]}`},
}

var fuzzStatuses = []int{200, 200, 200, 201, 400, 413, 429, 500, 503}

// FuzzHostileEngine feeds hostile engine bytes through whole exchanges with tenant limits on:
// a capacity (/server_info, /v1/models), a load (/v1/loads) and a reply (usage in any dialect
// with counts of every type and sign, whole or streamed, any status) on every generation and
// utility route. Nothing may panic (even recovered); afterwards no token is left in flight on
// the backend, and with the engine sane again a clean request is served, which at
// max_concurrent 1 proves the hostile exchange released its slot.
func FuzzHostileEngine(f *testing.F) {
	seeds := []struct {
		route  uint8
		stream bool
		status uint8
		reply  string
	}{
		{0, false, 0, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":-100000000,"completion_tokens":5,"total_tokens":-99999995}}`},
		{0, true, 0, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1e9,\"completion_tokens\":1.5}}\n\ndata: [DONE]\n\n"},
		{1, false, 0, `{"choices":[{"index":0,"text":"x"}],"usage":{"prompt_tokens":99999999999999999999999,"completion_tokens":"1"}}`},
		{2, false, 0, `[{"text":"a","meta_info":{"prompt_tokens":2147483648,"completion_tokens":2147483648}},{"text":"b","meta_info":{"prompt_tokens":-1}}]`},
		{2, true, 0, "data: {\"text\":\"a\",\"index\":-5,\"meta_info\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: {\"text\":\"ab\",\"index\":99999999999,\"meta_info\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n"},
		{3, false, 0, `{"object":"response","status":"completed","output":[],"usage":{"input_tokens":-3,"output_tokens":null,"total_tokens":7}}`},
		{3, true, 0, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":2147483647,\"output_tokens\":2147483647,\"total_tokens\":4294967294}}}\n\n"},
		{4, false, 0, `{"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":5,"output_tokens":-5,"cache_read_input_tokens":-9223372036854775808}}`},
		{4, true, 0, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":[1],\"output_tokens\":{}}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-1}}\n\n"},
		{5, false, 0, `{"tokens":[1,2],"count":-7,"max_model_len":-1}`},
		{6, false, 0, `{"input_tokens":1e400}`},
		{0, false, 7, `{"error":{"message":"boom"},"usage":{"prompt_tokens":5,"completion_tokens":5}}`},
	}
	for _, s := range seeds {
		f.Add(s.route, s.stream, s.status, []byte(s.reply),
			[]byte(`{"max_total_num_tokens":-1,"max_req_input_len":99999999999,"page_size":0,"disaggregation_mode":"null"}`),
			[]byte(`{"data":[{"id":"sim","max_model_len":1e9}]}`), []byte(`{"loads":[{"num_used_tokens":-9}]}`))
		f.Add(s.route, s.stream, s.status, []byte(s.reply), saneEngine.info, saneEngine.models, saneEngine.loads)
	}
	var script atomic.Pointer[engineScript]
	sane := saneEngine
	script.Store(&sane)
	g, set := limitsFuzzGateway(f, &script)
	b := set.Get("eng")
	set.PollOnce(b)
	ctx := &fasthttp.RequestCtx{}
	f.Fuzz(func(t *testing.T, route uint8, stream bool, status uint8, reply, info, models, loads []byte) {
		if len(reply) > 1<<16 || len(info)+len(models)+len(loads) > 1<<14 {
			return
		}
		// A fresh limiter per input: one input's charges (up to what its capacity allows) must
		// not refuse the next input's requests.
		g.lim.limiter = limits.NewLimiter(nil, 1, 100*time.Millisecond)
		panicsBefore := panicsTotal()
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		streamField := ""
		if stream && strings.Contains(r.body, "%s") {
			streamField = `,"stream":true`
		}
		script.Store(&engineScript{info: info, models: models, loads: loads,
			status: fuzzStatuses[int(status)%len(fuzzStatuses)], stream: stream, reply: reply})
		set.PollOnce(b)
		code, body := serveOne(t, g, ctx, r.path, strings.Replace(r.body, "%s", streamField, 1))
		if code == 500 && strings.Contains(string(body), apierr.Internal.Code) {
			t.Fatalf("%s: an internal error (a recovered panic): %s", r.path, body)
		}
		if n := b.Inflight(); n != 0 {
			t.Fatalf("%s: %d tokens still in flight after the exchange", r.path, n)
		}
		// The engine is sane again: a clean request is served.
		script.Store(&sane)
		set.PollOnce(b)
		if code, body := serveOne(t, g, ctx, "/generate", `{"text":"hello","sampling_params":{"max_new_tokens":4}}`); code != 200 {
			t.Fatalf("after a hostile %s exchange (%d), a clean request got %d %s", r.path, code, code, body)
		}
		if n := b.Inflight(); n != 0 {
			t.Fatalf("%d tokens in flight after the clean request", n)
		}
		if n := panicsTotal() - panicsBefore; n != 0 {
			t.Fatalf("%v panics recovered during a %s exchange", n, r.path)
		}
	})
}
