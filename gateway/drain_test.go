package gateway_test

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Gateway.Drain in process: StartDrain turns /readyz to 503 while requests are still served; at
// the drain deadline a stream blocked on its engine ends with a shutting_down error event, a
// non-streaming request waiting on its engine gets 503 shutting_down, and the result names both.
func TestDrainCutsAtTheDeadline(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "50ms")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))

	gw.GW.StartDrain()
	if r := get(t, gw.URL+"/readyz", ""); r.status != 503 || string(r.body) != `{"status":"draining"}` {
		t.Fatalf("readyz after StartDrain: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"still served","sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
		t.Fatalf("a request while draining: %d %s", r.status, r.body)
	}

	// A stream of 200 tokens at 50 ms (10 s), read past its first event.
	req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim","messages":[{"role":"user","content":"long"}],"max_tokens":200,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	req.Header.Set("X-Request-Id", "drain-stream-1")
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", err, resp)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadBytes('\n'); err != nil {
		t.Fatal(err)
	}
	streamBody := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(br)
		streamBody <- string(b)
	}()
	// A non-streaming request the engine takes 10 s to answer (engines see the gateway's own
	// request ids, so its arrival is counted, not looked up).
	arrived := len(sim.Stats(t).RequestIDs)
	whole := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"long","sampling_params":{"max_new_tokens":200}}`))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		req.Header.Set("X-Request-Id", "drain-whole-1")
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			whole <- reply{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		whole <- reply{status: resp.StatusCode, body: b}
	}()
	for deadline := time.Now().Add(5 * time.Second); len(sim.Stats(t).RequestIDs) == arrived; {
		if time.Now().After(deadline) {
			t.Fatal("the engine never got the non-streaming request")
		}
		time.Sleep(20 * time.Millisecond)
	}

	start := time.Now()
	res := gw.GW.Drain(300 * time.Millisecond)
	if took := time.Since(start); took > 300*time.Millisecond+3*time.Second {
		t.Fatalf("Drain took %s", took)
	}
	slices.Sort(res.Cut)
	if !slices.Equal(res.Cut, []string{"drain-stream-1", "drain-whole-1"}) || res.Open != 0 {
		t.Fatalf("drain result: %+v", res)
	}
	select {
	case b := <-streamBody:
		if !strings.Contains(b, `"code":"shutting_down"`) || !strings.HasSuffix(b, "data: [DONE]\n\n") {
			t.Fatalf("the stream's end: %q", b[max(0, len(b)-300):])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end after the drain")
	}
	if r := <-whole; r.status != 503 || !strings.Contains(string(r.body), `"code":"shutting_down"`) {
		t.Fatalf("the non-streaming request: %d %s", r.status, r.body)
	}
}

// Nothing in flight: Drain returns at once with nothing cut.
func TestDrainNothingInFlight(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	if r := post(t, gw.URL, "/generate", tenantKey, `{"text":"hi","sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	start := time.Now()
	if res := gw.GW.Drain(10 * time.Second); len(res.Cut) != 0 || res.Open != 0 {
		t.Fatalf("drain result: %+v", res)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("an idle drain took %s", took)
	}
}
