package gateway_test

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf16"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/testkit"
)

// This file is the adversarial probe of issue 12, class 1 and 5, made permanent: an untrusted
// engine (a loopback server sending chosen bytes) writes another tenant's marker in every form a
// client can decode, and a decoding client (content encodings, charset detection, every SSE
// framing, delta accumulation, first and last of duplicate keys, byte arrays, headers) must find
// no fragment of it, while the gateway records the leak or refuses the reply.

// fakeUnified is a healthy unified engine whose generation routes answer with gen.
func fakeUnified(t *testing.T, gen fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/server_info":
			ctx.SetBodyString(`{"max_total_num_tokens":8192,"max_req_input_len":8186,"page_size":16,"disaggregation_mode":"null"}`)
		case "/v1/models":
			ctx.SetBodyString(`{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`)
		case "/generate", "/v1/chat/completions", "/v1/completions":
			gen(ctx)
		case "/abort_request":
			ctx.SetBodyString(`{}`)
		default:
			ctx.SetStatusCode(404)
		}
	}, StreamRequestBody: false}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

const (
	victimKey    = "victim-key"
	requesterKey = "requester-key"
	canarySecret = "hostile-test-secret-padded-to-32-bytes"
)

func hostileYAML(url, extra string) string {
	return fmt.Sprintf(`backends: [{name: eng, url: %q, role: unified}]
tenants:
  - {name: alice, key_sha256: %q}
  - {name: bob, key_sha256: %q}
admin_key_sha256: %q
capacity: {poll_interval: 100ms}
canary: {enabled: true, secret: %q}
%s`, url, testkit.KeySHA256(victimKey), testkit.KeySHA256(requesterKey), testkit.KeySHA256("admin-key"), canarySecret, extra)
}

// hostileRig is a gateway in front of a fake engine whose reply each case sets.
type hostileRig struct {
	t      *testing.T
	gw     *testkit.Gateway
	victim string // alice's live marker
	mu     sync.Mutex
	reply  fasthttp.RequestHandler
}

func newHostileRig(t *testing.T, extra string) *hostileRig {
	r := &hostileRig{t: t}
	url := fakeUnified(t, func(ctx *fasthttp.RequestCtx) {
		r.mu.Lock()
		h := r.reply
		r.mu.Unlock()
		h(ctx)
	})
	cfg := testkit.ParseConfig(t, hostileYAML(url, extra))
	r.gw = testkit.StartGateway(t, cfg)
	kr := canary.NewKeyring([]byte(canarySecret), cfg.Canary.Epoch, cfg.Canary.DetectWindow, []string{"alice", "bob"})
	r.victim, _ = kr.Current("alice", time.Now())
	return r
}

func (r *hostileRig) set(h fasthttp.RequestHandler) {
	r.mu.Lock()
	r.reply = h
	r.mu.Unlock()
}

// leaks is the number of leak incidents recorded so far.
func (r *hostileRig) leaks() int {
	a := get(r.t, r.gw.URL+"/admin/incidents", "admin-key")
	var out struct {
		Incidents []struct {
			Kind   string `json:"kind"`
			Victim string `json:"victim"`
		} `json:"incidents"`
	}
	if err := json.Unmarshal(a.body, &out); err != nil {
		r.t.Fatalf("incidents: %s", a.body)
	}
	n := 0
	for _, i := range out.Incidents {
		if i.Kind == state.KindLeak && i.Victim == "alice" {
			n++
		}
	}
	return n
}

func (r *hostileRig) release() {
	req, _ := http.NewRequest("POST", r.gw.URL+"/admin/backends/eng/release", nil)
	req.Header.Set("Authorization", "Bearer admin-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	resp.Body.Close()
}

// ask sends bob's chat request and returns the raw reply.
func (r *hostileRig) ask(stream bool) (int, http.Header, []byte) {
	body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":%v}`, stream)
	req, _ := http.NewRequest("POST", r.gw.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+requesterKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "identity") // decode nothing ourselves: see what the wire carries
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	resp, err := c.Do(req)
	if err != nil {
		r.t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("reading the reply: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

// clientView is everything a client could decode from a reply, as one text: header lines, the
// raw body, the body after its content encoding and charset, every SSE data payload under every
// framing, every string of every JSON value (all duplicates, byte arrays decoded) and each
// field path's strings concatenated across events, as SDKs accumulate deltas.
func clientView(h http.Header, body []byte) string {
	var view strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			view.WriteString(k + ": " + v + "\n")
		}
	}
	view.Write(body)
	view.WriteByte('\n')
	switch strings.ToLower(h.Get("Content-Encoding")) {
	case "gzip":
		if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
			body, _ = io.ReadAll(zr)
		}
	case "deflate":
		if zr, err := zlib.NewReader(bytes.NewReader(body)); err == nil {
			body, _ = io.ReadAll(zr)
		} else {
			body, _ = io.ReadAll(flate.NewReader(bytes.NewReader(body)))
		}
	}
	text := string(body)
	if len(body) >= 2 && (body[0] == 0xFF && body[1] == 0xFE || body[1] == 0) {
		u := make([]uint16, len(body)/2)
		for i := range u {
			u[i] = uint16(body[2*i]) | uint16(body[2*i+1])<<8
		}
		text = string(utf16.Decode(u))
	}
	text = strings.TrimPrefix(text, "\ufeff")
	view.WriteString(text + "\n")
	acc := map[string]*strings.Builder{}
	collect := func(payload string) {
		dec := json.NewDecoder(strings.NewReader(payload))
		collectTokens(dec, "", acc, &view)
	}
	norm := strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n")
	if strings.Contains(norm, "data:") {
		for _, ev := range strings.Split(norm, "\n\n") {
			var data []string
			for _, line := range strings.Split(ev, "\n") {
				if v, ok := strings.CutPrefix(line, "data:"); ok {
					data = append(data, strings.TrimPrefix(v, " "))
				}
			}
			collect(strings.Join(data, "\n"))
		}
	} else {
		collect(text)
	}
	for _, b := range acc {
		view.WriteString(b.String() + viewBreak)
	}
	return view.String()
}

// viewBreak ends each decoded string in the client view. A newline alone is a separator the
// folded reading skips, so the next string (the key "index" after a delta's content) would
// continue a run no reader sees: at three hours in 48 (KVGATE_TEST_HOUR=16, 21, 22) the 7
// characters the gateway lets through and the i of "index" folded into 8 (issue 37). A quote
// breaks the run as it does in the raw body.
const viewBreak = "\n\"\n"

// collectTokens walks a JSON value token by token (so both values of a duplicate key are seen),
// writing every string to view and appending it to its path's accumulator.
func collectTokens(dec *json.Decoder, path string, acc map[string]*strings.Builder, view *strings.Builder) {
	tok, err := dec.Token()
	if err != nil {
		return
	}
	add := func(p, s string) {
		view.WriteString(s + viewBreak)
		if acc[p] == nil {
			acc[p] = &strings.Builder{}
		}
		acc[p].WriteString(s)
	}
	switch t := tok.(type) {
	case string:
		add(path, t)
	case json.Delim:
		switch t {
		case '{':
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return
				}
				ks, _ := k.(string)
				add(path+".#key", ks)
				collectTokens(dec, path+"."+ks, acc, view)
			}
			_, _ = dec.Token()
		case '[':
			var nums []byte
			allBytes := true
			for dec.More() {
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return
				}
				var n int
				if json.Unmarshal(raw, &n) == nil && n >= 0 && n < 256 {
					nums = append(nums, byte(n))
				} else {
					allBytes = false
				}
				collectTokens(json.NewDecoder(bytes.NewReader(raw)), path+".*", acc, view)
			}
			_, _ = dec.Token()
			if allBytes && len(nums) > 0 {
				add(path+".#bytes", string(nums))
			}
		}
	}
}

// fold is what a reader sees: case, fullwidth forms and invisible characters do not matter.
func fold(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.In(r, unicode.Cf, unicode.Mn, unicode.Me):
			continue
		case r >= 0xFF01 && r <= 0xFF5E:
			r -= 0xFF01 - '!'
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// fragment is the longest piece (from its start) of the marker's characters in view, folded.
func fragment(view, marker string) int {
	v, body := fold(view), marker[len(canary.MarkerPrefix):]
	for n := len(body); n > 0; n-- {
		if strings.Contains(v, body[:n]) {
			return n
		}
	}
	return 0
}

func sse(ctx *fasthttp.RequestCtx, contentType string, raw string) {
	ctx.SetContentType(contentType)
	ctx.SetBodyString(raw)
}

func chunkJSON(field, value string) string {
	b, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{field: value}}}})
	return string(b)
}

// escapeAll writes every character of s as a \u escape inside a JSON string.
func escapeAll(s string) string {
	var b strings.Builder
	for _, r := range s {
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

func gz(s string) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.Bytes()
}

func deflated(s string) []byte {
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.Bytes()
}

func utf16le(s string) []byte {
	out := []byte{0xFF, 0xFE}
	for _, u := range utf16.Encode([]rune(s)) {
		out = append(out, byte(u), byte(u>>8))
	}
	return out
}

func upper(s string) string { return strings.ToUpper(s) }

func zeroWidth(m string) string {
	body := m[len(canary.MarkerPrefix):]
	var b strings.Builder
	for i, r := range body {
		if i > 0 {
			b.WriteString("\u200b")
		}
		b.WriteRune(r)
	}
	return b.String()
}

type hostileCase struct {
	name   string
	stream bool
	reply  func(ctx *fasthttp.RequestCtx, m string)
}

func hostileCases() []hostileCase {
	streamOf := func(ct string, events func(m string) string) func(*fasthttp.RequestCtx, string) {
		return func(ctx *fasthttp.RequestCtx, m string) { sse(ctx, ct, events(m)) }
	}
	esc := func(m string) string {
		return `{"choices":[{"index":0,"delta":{"content":"x ` + escapeAll(m) + `"}}]}`
	}
	return []hostileCase{
		// Class 1: framings and encodings the scanner used to read differently.
		{"escaped marker after id, event and comment lines", true, streamOf("text/event-stream", func(m string) string {
			return ": hi\nid: 1\nevent: message\ndata: " + esc(m) + "\n\ndata: [DONE]\n\n"
		})},
		{"CR-only framing", true, streamOf("text/event-stream", func(m string) string {
			return "data: " + chunkJSON("content", "a") + "\r\rdata: " + esc(m) + "\r\rdata: [DONE]\r\r"
		})},
		{"data split over lines", true, streamOf("text/event-stream", func(m string) string {
			return "data: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"content\":\"" + escapeAll(m) + "\"}}]}\n\ndata: [DONE]\n\n"
		})},
		{"stream with a non-SSE content type", true, streamOf("text/plain", func(m string) string {
			return "data: " + esc(m) + "\n\ndata: [DONE]\n\n"
		})},
		{"duplicate keys in an event", true, streamOf("text/event-stream", func(m string) string {
			return `data: {"choices":[{"index":0,"delta":{"content":"` + m + `","content":"hi"}}]}` + "\n\ndata: [DONE]\n\n"
		})},
		{"gzip stream", true, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("text/event-stream")
			ctx.Response.Header.Set("Content-Encoding", "gzip")
			ctx.SetBody(gz("data: " + esc(m) + "\n\ndata: [DONE]\n\n"))
		}},
		{"brotli stream (refused)", true, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("text/event-stream")
			ctx.Response.Header.Set("Content-Encoding", "br")
			ctx.SetBodyString("data: " + esc(m) + "\n\n")
		}},
		{"UTF-16 event stream (refused)", true, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("text/event-stream; charset=utf-16")
			ctx.SetBody(utf16le("data: " + esc(m) + "\n\n"))
		}},
		{"marker in a reply header", true, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.Response.Header.Set("X-Debug-Context", "stale: "+m)
			sse(ctx, "text/event-stream", "data: "+chunkJSON("content", "fine")+"\n\ndata: [DONE]\n\n")
		}},
		{"tool-call name split across events", true, streamOf("text/event-stream", func(m string) string {
			ev := func(part string) string {
				b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{
					"tool_calls": []any{map[string]any{"index": 0, "id": "call_1", "function": map[string]any{"name": part}}}}}}})
				return "data: " + string(b) + "\n\n"
			}
			return ev(m[:9]) + ev(m[9:16]) + ev(m[16:]) + "data: [DONE]\n\n"
		})},
		{"role split across events", true, streamOf("text/event-stream", func(m string) string {
			return "data: " + chunkJSON("role", m[:10]) + "\n\ndata: " + chunkJSON("role", m[10:]) + "\n\ndata: [DONE]\n\n"
		})},
		{"chunk id split across events", true, streamOf("text/event-stream", func(m string) string {
			ev := func(id string) string {
				b, _ := json.Marshal(map[string]any{"id": id, "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": "a"}}}})
				return "data: " + string(b) + "\n\n"
			}
			return ev(m[:12]) + ev(m[12:]) + "data: [DONE]\n\n"
		})},
		{"logprob bytes", true, streamOf("text/event-stream", func(m string) string {
			var nums []string
			for _, c := range []byte(m) {
				nums = append(nums, fmt.Sprint(int(c)))
			}
			return `data: {"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-1,"bytes":[` +
				strings.Join(nums, ",") + `]}]}}]}` + "\n\ndata: [DONE]\n\n"
		})},
		{"upper case", true, streamOf("text/event-stream", func(m string) string {
			return "data: " + chunkJSON("content", "see "+upper(m)) + "\n\ndata: [DONE]\n\n"
		})},
		{"zero-width characters, no prefix", true, streamOf("text/event-stream", func(m string) string {
			return "data: " + chunkJSON("content", "see "+zeroWidth(m)) + "\n\ndata: [DONE]\n\n"
		})},
		{"no prefix, split across deltas", true, streamOf("text/event-stream", func(m string) string {
			body := m[len(canary.MarkerPrefix):]
			return "data: " + chunkJSON("content", "see "+body[:7]) + "\n\ndata: " + chunkJSON("content", body[7:]) + "\n\ndata: [DONE]\n\n"
		})},
		// Non-streaming replies.
		{"escaped marker in a body", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[{"index":0,"message":{"role":"assistant","content":"` + escapeAll(m) + `"}}]}`)
		}},
		{"duplicate keys in a body", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[{"index":0,"message":{"content":"` + m + `","content":"hello"}}]}`)
		}},
		{"gzip body", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.Response.Header.Set("Content-Encoding", "gzip")
			ctx.SetBody(gz(`{"choices":[{"index":0,"message":{"content":"` + escapeAll(m) + `"}}]}`))
		}},
		{"deflate body", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.Response.Header.Set("Content-Encoding", "deflate")
			ctx.SetBody(deflated(`{"choices":[{"index":0,"message":{"content":"` + m + `"}}]}`))
		}},
		{"UTF-16 body with a BOM", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.SetBody(utf16le(`{"choices":[{"index":0,"message":{"content":"` + m + `"}}]}`))
		}},
		{"UTF-16 body without a BOM", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.SetBody(utf16le(`{"choices":[{"index":0,"message":{"content":"` + m + `"}}]}`)[2:])
		}},
		{"mixed case body", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[{"index":0,"message":{"content":"` + mixed(m) + `"}}]}`)
		}},
		{"text body that is not JSON", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.SetContentType("text/plain")
			ctx.SetBodyString("stale page: " + m)
		}},
		{"marker in a header of a body reply", false, func(ctx *fasthttp.RequestCtx, m string) {
			ctx.Response.Header.Set("X-Trace", upper(m))
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"choices":[{"index":0,"message":{"content":"fine"}}]}`)
		}},
	}
}

func mixed(s string) string {
	b := []byte(s)
	for i := range b {
		if i%3 == 0 && b[i] >= 'a' && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

func TestHostileEngineCannotLeakAMarker(t *testing.T) {
	rig := newHostileRig(t, "")
	for _, c := range hostileCases() {
		before := rig.leaks()
		rig.set(func(ctx *fasthttp.RequestCtx) { c.reply(ctx, rig.victim) })
		status, h, body := rig.ask(c.stream)
		view := clientView(h, body)
		if n := fragment(view, rig.victim); n >= canary.FragmentMin {
			t.Errorf("%s: %d characters of the victim's marker reached the client (status %d): %q", c.name, n, status, body)
		}
		// Each case ends in a cut with an incident, or in a refusal of the reply.
		deadline := time.Now().Add(3 * time.Second)
		for rig.leaks() == before && status == 200 && !bytes.Contains(body, []byte("upstream_")) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		recorded := rig.leaks() > before
		refused := status >= 500 || bytes.Contains(body, []byte(`"upstream_error"`)) || bytes.Contains(body, []byte(`"upstream_integrity"`))
		if !recorded && !refused {
			t.Errorf("%s: neither a leak incident nor a refusal: %d %s", c.name, status, body)
		}
		t.Logf("%s: status %d, leak recorded %v, body %.120q", c.name, status, recorded, body)
		rig.release()
	}
}

// A reply with nothing foreign in it passes whatever the framing: the content arrives whole.
func TestHostileFramingsOfCleanReplies(t *testing.T) {
	rig := newHostileRig(t, "")
	for name, raw := range map[string]string{
		"CR":       "data: " + chunkJSON("content", "Hello") + "\r\rdata: " + chunkJSON("content", " world") + "\r\rdata: [DONE]\r\r",
		"CRLF":     "data: " + chunkJSON("content", "Hello") + "\r\n\r\ndata: " + chunkJSON("content", " world") + "\r\n\r\ndata: [DONE]\r\n\r\n",
		"comments": ": ping\n\ndata: " + chunkJSON("content", "Hello") + "\n\n: ping\nid: 4\ndata: " + chunkJSON("content", " world") + "\n\ndata: [DONE]\n\n",
		"no end":   "data: " + chunkJSON("content", "Hello") + "\n\ndata: " + chunkJSON("content", " world"),
	} {
		rig.set(func(ctx *fasthttp.RequestCtx) { sse(ctx, "text/event-stream", raw) })
		status, h, body := rig.ask(true)
		if status != 200 || h.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: %d %v", name, status, h)
		}
		text := accumulated(t, body, "content")
		if text != "Hello world" || strings.Contains(string(body), "ping") || strings.Contains(string(body), "id:") {
			t.Fatalf("%s: client got %q", name, body)
		}
	}
}

// Class 5: an engine that never ends an event is cut at upstream.max_event_bytes, with an error
// event, instead of being buffered whole; and a client that leaves stops the gateway reading.
func TestEndlessEventIsCut(t *testing.T) {
	rig := newHostileRig(t, "upstream: {max_event_bytes: 65536}\n")
	var wrote sync.WaitGroup
	wrote.Add(1)
	sent := make(chan int64, 1)
	rig.set(func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer wrote.Done()
			var n int64
			chunk := bytes.Repeat([]byte("x"), 4096)
			_, _ = w.WriteString("data: ")
			for n < 64<<20 {
				if _, err := w.Write(chunk); err != nil {
					break
				}
				if err := w.Flush(); err != nil {
					break
				}
				n += int64(len(chunk))
			}
			sent <- n
		})
	})
	start := time.Now()
	status, _, body := rig.ask(true)
	if status != 200 || !bytes.Contains(body, []byte(`"upstream_error"`)) || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
		t.Fatalf("endless event: %d %.200q", status, body)
	}
	if len(body) > 4096 {
		t.Fatalf("the client got %d bytes of a refused event", len(body))
	}
	wrote.Wait()
	n := <-sent
	if n >= 64<<20 {
		t.Fatalf("the gateway read the whole 64 MiB event (%d bytes)", n)
	}
	t.Logf("cut after the engine wrote %d bytes, in %v", n, time.Since(start))
}

// A client that leaves a long stream makes the gateway stop reading it: the engine's writes fail
// soon after, and the engine is told to abort.
func TestClientGoneStopsTheStream(t *testing.T) {
	rig := newHostileRig(t, "")
	stopped := make(chan time.Time, 1)
	rig.set(func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := 0; i < 100000; i++ {
				_, _ = w.WriteString("data: " + chunkJSON("content", "tok ") + "\n\n")
				if err := w.Flush(); err != nil {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			stopped <- time.Now()
		})
	})
	req, _ := http.NewRequest("POST", rig.gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim","messages":[{"role":"user","content":"hello"}],"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+requesterKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	resp.Body.Close()
	select {
	case at := <-stopped:
		t.Logf("engine stopped %v after the client left", at.Sub(left))
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway kept reading the engine's stream 10 s after the client left")
	}
}
