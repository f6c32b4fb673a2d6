package enginesim

import (
	"bufio"
	"bytes"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

// Fast mode (Config.Fast): a backend whose cost is close to nothing, for benchmarks of what sits
// in front of it. The prompt is not parsed (only whether the body asks for a stream), nothing is
// tokenized, counted or allocated in the pool; replies are fixed and well formed for each route.
//
// Each streamed content event carries the wall-clock time it was written, in nanoseconds, as its
// text ("t<ns>"), so a client on the same machine can measure every event's delivery latency and
// compare a path through a proxy with the direct one.

var (
	fastChat       = []byte(`{"id":"fast","object":"chat.completion","created":0,"model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"logprobs":null,"finish_reason":"stop","matched_stop":null}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}`)
	fastCompletion = []byte(`{"id":"fast","object":"text_completion","created":0,"model":"sim","choices":[{"index":0,"text":"ok","logprobs":null,"finish_reason":"stop","matched_stop":null}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}`)
	fastGenerate   = []byte(`{"text":"ok","output_ids":[1],"meta_info":{"id":"fast","finish_reason":{"type":"stop"},"prompt_tokens":8,"completion_tokens":1,"cached_tokens":0}}`)
)

// wantsStream reports whether a JSON body sets "stream" to true, without decoding it.
func wantsStream(body []byte) bool {
	return bytes.Contains(body, []byte(`"stream":true`)) || bytes.Contains(body, []byte(`"stream": true`))
}

func (s *Server) handleFast(ctx *fasthttp.RequestCtx, path string) {
	if s.cfg.FixedDelay > 0 {
		time.Sleep(s.cfg.FixedDelay)
	}
	if !wantsStream(ctx.PostBody()) {
		ctx.SetContentType("application/json")
		switch path {
		case "/v1/chat/completions":
			ctx.SetBody(fastChat)
		case "/v1/completions":
			ctx.SetBody(fastCompletion)
		default:
			ctx.SetBody(fastGenerate)
		}
		return
	}
	n, interval := s.cfg.FastEvents, s.cfg.EventInterval
	wire.WriteStream(ctx, func(w *bufio.Writer) error {
		var buf []byte
		event := func(b []byte) error {
			w.WriteString("data: ")
			w.Write(b)
			w.WriteString("\n\n")
			return w.Flush()
		}
		if path == "/v1/chat/completions" {
			if err := event([]byte(`{"id":"fast","object":"chat.completion.chunk","created":0,"model":"sim","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}]}`)); err != nil {
				return err
			}
		}
		for i := 0; i < n; i++ {
			if interval > 0 {
				time.Sleep(interval)
			}
			buf = fastEvent(buf[:0], path, i, n)
			if err := event(buf); err != nil {
				return err
			}
		}
		if path != "/generate" {
			if err := event(fastFinal(path)); err != nil {
				return err
			}
		}
		w.WriteString("data: [DONE]\n\n")
		return w.Flush()
	})
}

// fastEvent appends content event i of n, its text the current time ("t<unix ns>").
func fastEvent(b []byte, path string, i, n int) []byte {
	ts := time.Now().UnixNano()
	switch path {
	case "/v1/chat/completions":
		b = append(b, `{"id":"fast","object":"chat.completion.chunk","created":0,"model":"sim","choices":[{"index":0,"delta":{"content":"t`...)
		b = strconv.AppendInt(b, ts, 10)
		return append(b, ` "},"logprobs":null,"finish_reason":null,"matched_stop":null}]}`...)
	case "/v1/completions":
		b = append(b, `{"id":"fast","object":"text_completion","created":0,"model":"sim","choices":[{"index":0,"text":"t`...)
		b = strconv.AppendInt(b, ts, 10)
		return append(b, ` ","logprobs":null,"finish_reason":null,"matched_stop":null}]}`...)
	}
	// /generate streams the whole text so far; only the newest timestamp matters to a reader.
	b = append(b, `{"text":"t`...)
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, ` ","output_ids":[1],"meta_info":{"id":"fast","prompt_tokens":8,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(i+1), 10)
	if i == n-1 {
		b = append(b, `,"finish_reason":{"type":"stop"}`...)
	} else {
		b = append(b, `,"finish_reason":null`...)
	}
	return append(b, `}}`...)
}

func fastFinal(path string) []byte {
	if path == "/v1/chat/completions" {
		return []byte(`{"id":"fast","object":"chat.completion.chunk","created":0,"model":"sim","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","matched_stop":null}]}`)
	}
	return []byte(`{"id":"fast","object":"text_completion","created":0,"model":"sim","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","matched_stop":null}]}`)
}
