package wire

import (
	"bufio"

	"github.com/valyala/fasthttp"
)

// WriteEvent writes one "data: JSON\n\n" frame and flushes it.
func WriteEvent(w *bufio.Writer, v any) error {
	b, err := Marshal(v)
	if err != nil {
		return err
	}
	w.WriteString("data: ")
	w.Write(b)
	w.WriteString("\n\n")
	return w.Flush()
}

// WriteStream runs fn as the body writer of a streamed reply. fn must not
// touch ctx: fasthttp recycles it once the handler returns.
func WriteStream(ctx *fasthttp.RequestCtx, fn func(w *bufio.Writer) error) {
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.ImmediateHeaderFlush = true
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) { _ = fn(w) })
}

// SSEEvent writes one "event: NAME\ndata: JSON\n\n" frame and flushes it.
func SSEEvent(w *bufio.Writer, name string, v any) error {
	b, err := Marshal(v)
	if err != nil {
		return err
	}
	w.WriteString("event: ")
	w.WriteString(name)
	w.WriteString("\ndata: ")
	w.Write(b)
	w.WriteString("\n\n")
	return w.Flush()
}
