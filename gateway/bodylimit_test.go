package gateway_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// A declared Content-Length over max_body_bytes is refused from the headers: 413
// request_too_large at once, whether the client sends no body at all, a little of it, or asks
// "Expect: 100-continue" (which must not be invited to upload).
func TestBodyLimitRefusedFromHeader(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("max_body_bytes: 65536\n", [3]string{"sim", sim.URL, "unified"})))
	for _, c := range []struct {
		name, extra, body string
	}{
		{"headers only", "", ""},
		{"some body", "", `{"text":"` + strings.Repeat("a", 100)},
		{"expect 100-continue", "Expect: 100-continue\r\n", ""},
		{"no key", "", ""},
	} {
		conn, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		auth := "Authorization: Bearer " + tenantKey + "\r\n"
		if c.name == "no key" {
			auth = ""
		}
		start := time.Now()
		_, _ = io.WriteString(conn, "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+auth+c.extra+
			"Content-Length: 10737418240\r\n\r\n"+c.body)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		took := time.Since(start)
		var e struct {
			Error struct{ Code, Type string } `json:"error"`
		}
		if resp.StatusCode != 413 || json.Unmarshal(b, &e) != nil || e.Error.Code != "request_too_large" || e.Error.Type != "invalid_request_error" {
			t.Fatalf("%s: %d %s, want 413 request_too_large", c.name, resp.StatusCode, b)
		}
		if took > time.Second {
			t.Fatalf("%s: the refusal took %v: it must not wait for the body", c.name, took)
		}
	}
	// A body within the limit is still read and served.
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hello","sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
		t.Fatalf("small body: %d %s", r.status, r.body)
	}
	// And a body over the limit without a truthful Content-Length (chunked) is refused too.
	req, _ := http.NewRequest("POST", gw.URL+"/generate", io.MultiReader(strings.NewReader(`{"text":"`), strings.NewReader(strings.Repeat("a", 70000)), strings.NewReader(`"}`)))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Fatalf("chunked oversized body: %d", resp.StatusCode)
		}
	}
	if st := sim.Stats(t); st.Requests["/generate"] != 1 {
		t.Fatalf("the engine should have seen only the small request: %+v", st.Requests)
	}
}

// An oversized body on Anthropic's route is refused in Anthropic's envelope with one
// X-Request-Id, like every other refusal there (issue 48: it came in OpenAI's, without an id),
// whether it is refused from the header, after "Expect: 100-continue", or while reading.
func TestBodyLimitOnMessagesInAnthropicsEnvelope(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("max_body_bytes: 65536\n", [3]string{"sim", sim.URL, "unified"})))
	for _, c := range []struct{ name, extra, length, body string }{
		{"from the header", "", "10737418240", ""},
		{"expect 100-continue", "Expect: 100-continue\r\n", "10737418240", ""},
		{"while reading", "", "70000", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("a", 69900) + `"}]}`},
	} {
		conn, err := net.Dial("tcp", gw.Addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(conn, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Api-Key: "+tenantKey+"\r\n"+
			"Authorization: Bearer "+tenantKey+"\r\n"+c.extra+"Content-Length: "+c.length+"\r\n\r\n"+c.body)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != 413 || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "request_too_large" || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want 413 in Anthropic's envelope (type error, error.type request_too_large)", c.name, resp.StatusCode, b)
		}
		if ids := resp.Header.Values("X-Request-Id"); len(ids) != 1 || ids[0] == "" {
			t.Errorf("%s: X-Request-Id %q, want exactly one", c.name, ids)
		}
	}
}
