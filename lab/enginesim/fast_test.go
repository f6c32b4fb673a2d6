package enginesim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// Fast mode's replies must be what the gateway accepts: every body and every event one JSON
// value, streams ending in [DONE], content events carrying their timestamp.
func TestFastRepliesAreWellFormed(t *testing.T) {
	s, err := New(Config{Fast: true, FastEvents: 3})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/generate"} {
		for _, stream := range []bool{false, true} {
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetRequestURI(path)
			body := `{"messages":[{"role":"user","content":"hi"}],"prompt":"hi","text":"hi"}`
			if stream {
				body = `{"stream": true,"messages":[{"role":"user","content":"hi"}]}`
			}
			ctx.Request.SetBodyString(body)
			h(&ctx)
			if ctx.Response.StatusCode() != 200 {
				t.Fatalf("%s: status %d", path, ctx.Response.StatusCode())
			}
			var out bytes.Buffer
			if bs := ctx.Response.BodyStream(); bs != nil || stream {
				if err := ctx.Response.BodyWriteTo(&out); err != nil {
					t.Fatal(err)
				}
			} else {
				out.Write(ctx.Response.Body())
			}
			if !stream {
				if !json.Valid(out.Bytes()) {
					t.Fatalf("%s: not JSON: %s", path, out.Bytes())
				}
				continue
			}
			var data []string
			sc := bufio.NewScanner(&out)
			for sc.Scan() {
				if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					data = append(data, d)
				}
			}
			if len(data) < 4 || data[len(data)-1] != "[DONE]" {
				t.Fatalf("%s: events %q", path, data)
			}
			stamped := 0
			for _, d := range data[:len(data)-1] {
				if !json.Valid([]byte(d)) {
					t.Fatalf("%s: event not JSON: %s", path, d)
				}
				if strings.Contains(d, `"t1`) {
					stamped++
				}
			}
			if stamped != 3 {
				t.Fatalf("%s: %d stamped events, want 3: %q", path, stamped, data)
			}
		}
	}
}
