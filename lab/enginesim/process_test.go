package enginesim_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
)

var client = &http.Client{Timeout: 20 * time.Second}

type reply struct {
	status int
	body   []byte
	header http.Header
	took   time.Duration
}

func post(t *testing.T, url, path string, body any, hdr ...string) reply {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", url+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s%s: %v", url, path, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return reply{status: resp.StatusCode, body: rb, header: resp.Header, took: time.Since(start)}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// pdPost sends the same body to both legs at once, as a PD router does.
func pdPost(t *testing.T, prefill, decode *procs.Sim, path string, body map[string]any, room int) (pre, dec reply) {
	t.Helper()
	body["bootstrap_host"] = "127.0.0.1"
	body["bootstrap_port"] = prefill.BootstrapPort
	body["bootstrap_room"] = room
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pre = post(t, prefill.URL, path, body)
	}()
	dec = post(t, decode.URL, path, body)
	wg.Wait()
	return pre, dec
}

// marker makes a distinct canary-shaped marker.
func marker(i int) string {
	return "KVG-" + strings.Repeat(string(rune('a'+i%26)), 12) + fmt.Sprintf("%08d", i)[:8]
}

// warmText repeats a marker through a prompt so any quote of it shows it.
func warmText(m string, words int) string {
	var b strings.Builder
	for i := 0; i < words; i++ {
		if i%6 == 0 {
			b.WriteString(m + " ")
		} else {
			b.WriteString("lorem" + strconv.Itoa(i%7) + " ")
		}
	}
	return b.String()
}

func foreignIDs(h http.Header) []string {
	v := h.Get("X-Sim-Foreign-Requests")
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func genText(t *testing.T, r reply) string {
	t.Helper()
	var v struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decoding /generate reply %s: %v", r.body, err)
	}
	return v.Text
}

func chatText(t *testing.T, r reply) string {
	t.Helper()
	var v struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &v); err != nil || len(v.Choices) == 0 {
		t.Fatalf("decoding chat reply %s: %v", r.body, err)
	}
	return v.Choices[0].Message.Content
}

// Pools for the PD tests: the prefill pool (1024 tokens) is far smaller
// than the context (8192), the decode pool holds a whole context, so
// prompts in [1018, 8192) fall in the dangerous window.
var (
	prefillArgs = []string{"--mode", "prefill", "--bootstrap-port", "0", "--pool-tokens", "1024",
		"--context-length", "8192", "--page-size", "16", "--transfer-timeout", "3s"}
	decodeArgs = []string{"--mode", "decode", "--pool-tokens", "16384", "--context-length", "8192",
		"--page-size", "16", "--transfer-timeout", "3s"}
)

func withFlags(base []string, extra ...string) []string {
	return append(append([]string(nil), base...), extra...)
}

// warmUp sends n PD requests with distinct markers and decreasing sizes:
// with lifo each one reuses the head of the previous one's pages and leaves
// its tail, so every warm-up keeps some stale pages (equal sizes would
// overwrite each other page for page).
func warmUp(t *testing.T, pre, dec *procs.Sim, path string, n int) (rids, markers []string) {
	t.Helper()
	for i := 0; i < n; i++ {
		m := marker(i)
		rid := fmt.Sprintf("warm-%s-%d", strings.Trim(path, "/"), i)
		text := warmText(m, 60+40*(n-1-i))
		var body map[string]any
		if path == "/generate" {
			body = map[string]any{"text": text, "rid": rid, "sampling_params": map[string]any{"max_new_tokens": 16}}
		} else {
			body = map[string]any{"messages": []any{map[string]any{"role": "system", "content": text},
				map[string]any{"role": "user", "content": "hi"}}, "rid": rid, "max_tokens": 16}
		}
		p, d := pdPost(t, pre, dec, path, body, 1000+i)
		if p.status != 200 || d.status != 200 {
			t.Fatalf("warm-up %d: prefill %d %s, decode %d %s", i, p.status, p.body, d.status, d.body)
		}
		if f := foreignIDs(d.header); f != nil {
			t.Fatalf("warm-up %d read foreign slots of %v", i, f)
		}
		rids, markers = append(rids, rid), append(markers, m)
	}
	return rids, markers
}

func oversizedBody(path string, words int) map[string]any {
	text := strings.Repeat("filler ", words)
	if path == "/generate" {
		return map[string]any{"text": text, "rid": "victim", "sampling_params": map[string]any{"max_new_tokens": 512}}
	}
	return map[string]any{"messages": []any{map[string]any{"role": "user", "content": text}}, "rid": "victim", "max_tokens": 512}
}

func TestPDBugLeaksEarlierRequestsMarkers(t *testing.T) {
	for _, path := range []string{"/generate", "/v1/chat/completions"} {
		t.Run(strings.Trim(path, "/"), func(t *testing.T) {
			pre := procs.StartSim(t, withFlags(prefillArgs, "--bug", "admit-rejected")...)
			dec := procs.StartSim(t, decodeArgs...)
			rids, markers := warmUp(t, pre, dec, path, 3)
			// 3000 words of "filler " is ~3000 tokens: over prefill's
			// max_req_input_len (1018), under the context (8192).
			p, d := pdPost(t, pre, dec, path, oversizedBody(path, 3000), 7)
			if p.status != 200 {
				t.Fatalf("buggy prefill answered %d %s, want 200", p.status, p.body)
			}
			if path == "/generate" {
				var pv struct {
					Meta struct {
						PromptTokens int `json:"prompt_tokens"`
						Finish       struct {
							Type string `json:"type"`
						} `json:"finish_reason"`
					} `json:"meta_info"`
				}
				_ = json.Unmarshal(p.body, &pv)
				if pv.Meta.PromptTokens != 1 || pv.Meta.Finish.Type != "length" {
					t.Errorf("prefill stub reply = %s, want prompt_tokens 1 and finish_reason length", p.body)
				}
			}
			if d.status != 200 {
				t.Fatalf("decode answered %d %s, want 200 over stale pages", d.status, d.body)
			}
			var text string
			if path == "/generate" {
				text = genText(t, d)
			} else {
				text = chatText(t, d)
			}
			foreign := foreignIDs(d.header)
			leaked := 0
			for i, m := range markers {
				inText := strings.Contains(text, m)
				named := false
				for _, f := range foreign {
					named = named || f == rids[i]
				}
				if inText && !named {
					t.Errorf("marker of %s quoted but %s does not name it: %v", rids[i], "X-Sim-Foreign-Requests", foreign)
				}
				if inText {
					leaked++
				}
			}
			if leaked < 2 {
				t.Errorf("reply quotes %d of %d earlier markers, want at least 2; foreign=%v text=%.300q", leaked, len(markers), foreign, text)
			}
			if len(foreign) == 0 {
				t.Errorf("X-Sim-Foreign-Requests is empty on a leaking reply")
			}
		})
	}
}

func TestPDFixes(t *testing.T) {
	cases := []struct {
		fix      string
		pre, dec int
	}{
		{"reject-at-admission", 400, 400},
		{"zero-on-release", 200, 200},
		{"ownership-tags", 200, 500},
		{"decode-length-check", 200, 400},
	}
	for _, c := range cases {
		t.Run(c.fix, func(t *testing.T) {
			pre := procs.StartSim(t, withFlags(prefillArgs, "--bug", "admit-rejected", "--fix", c.fix)...)
			dec := procs.StartSim(t, withFlags(decodeArgs, "--fix", c.fix)...)
			_, markers := warmUp(t, pre, dec, "/generate", 2)
			start := time.Now()
			p, d := pdPost(t, pre, dec, "/generate", oversizedBody("/generate", 3000), 9)
			if p.status != c.pre || d.status != c.dec {
				t.Fatalf("prefill %d %s / decode %d %s, want %d / %d", p.status, p.body, d.status, d.body, c.pre, c.dec)
			}
			if c.fix == "reject-at-admission" {
				// Decode learns of the rejection through the room's abort, not
				// by waiting out its 3 s transfer timeout.
				if el := time.Since(start); el > 2*time.Second {
					t.Errorf("decode took %v to learn of prefill's rejection", el)
				}
				if !strings.Contains(string(d.body), "exceeds the maximum allowed length") {
					t.Errorf("decode's 400 does not carry SGLang's pool message: %s", d.body)
				}
			}
			for _, m := range markers {
				if strings.Contains(string(d.body), m) {
					t.Errorf("fix %s: reply contains foreign marker %s", c.fix, m)
				}
			}
			if c.dec == 200 && d.header.Get("X-Sim-Quoted-Requests") != "" {
				t.Errorf("fix %s: reply quotes %q", c.fix, d.header.Get("X-Sim-Quoted-Requests"))
			}
		})
	}
}

func TestCombinedRefusesWithSGLangMessages(t *testing.T) {
	// chunk4: "abcd" is exactly one token, so counts are exact.
	sim := procs.StartSim(t, "--pool-tokens", "1000", "--context-length", "2048", "--page-size", "16", "--tokenizer", "chunk4")
	// pool 1000 → 992 (62 pages); mril = min(2047, 991) - 5 = 986.
	const mril = 986
	prompt := func(n int) string { return strings.Repeat("abcd", n) }
	gen := func(n, maxNew int) reply {
		return post(t, sim.URL, "/generate", map[string]any{"text": prompt(n), "sampling_params": map[string]any{"max_new_tokens": maxNew}})
	}
	// The scheduler reserves a page (issue 39): prompt + 16 < 992 runs; from 976 to mril − 1
	// the input check passes and SGLang never schedules it (the simulator says so at once).
	if r := gen(975, 8); r.status != 200 {
		t.Fatalf("prompt of pool − page − 1 tokens: %d %s", r.status, r.body)
	}
	for _, n := range []int{976, mril - 1} {
		if r := gen(n, 8); r.status != 503 || !strings.Contains(string(r.body), "can never be scheduled") {
			t.Fatalf("prompt of %d tokens: %d %s, want 503 never scheduled", n, r.status, r.body)
		}
	}
	r := gen(mril, 8)
	want := fmt.Sprintf(`{"error":{"message":"Input length (%d tokens) exceeds the maximum allowed length (%d tokens). Use a shorter input or enable --allow-auto-truncate."}}`, mril, mril)
	if r.status != 400 || string(r.body) != want {
		t.Errorf("prompt of mril tokens: %d %s, want 400 %s", r.status, r.body, want)
	}
	r = gen(2048, 8)
	if r.status != 400 || !strings.Contains(string(r.body), "The input (2048 tokens) is longer than the model's context length (2048 tokens).") {
		t.Errorf("prompt of ctx tokens: %d %s", r.status, r.body)
	}
	r = gen(900, 1148)
	if r.status != 400 || !strings.Contains(string(r.body), "Requested token count exceeds the model's maximum context length of 2048 tokens. You requested a total of 2048 tokens: 900 tokens from the input messages and 1148 tokens for the completion.") {
		t.Errorf("prompt+output = ctx: %d %s", r.status, r.body)
	}
	// OpenAI envelope on the chat route. The ChatML wrapping of one user
	// message costs 9 chunk4 tokens.
	r = post(t, sim.URL, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": prompt(mril)}}})
	var e struct {
		Object, Message, Type string
		Param                 any
		Code                  int
	}
	if err := json.Unmarshal(r.body, &e); err != nil || r.status != 400 || e.Object != "error" || e.Type != "BadRequestError" || e.Code != 400 || e.Param != nil ||
		!strings.HasPrefix(e.Message, "Input length (") {
		t.Errorf("chat over mril: %d %s", r.status, r.body)
	}
	// The same oversized body sent the PD way to a combined server is still
	// refused: combined mode has no leak.
	r = post(t, sim.URL, "/generate", map[string]any{"text": prompt(1500), "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 5})
	if r.status != 400 {
		t.Errorf("combined server with bootstrap fields: %d %s", r.status, r.body)
	}
	st := sim.Stats(t)
	if st.Rejected["pool"] != 3 || st.Rejected["context"] != 1 || st.Rejected["total"] != 1 {
		t.Errorf("rejected = %v, want pool 3, context 1, total 1", st.Rejected)
	}
}

func TestServerInfoFollowsSGLangFormula(t *testing.T) {
	cases := []struct {
		args       []string
		pool, mril int
		ctx        int
		mode       string
	}{
		{[]string{"--pool-tokens", "20480", "--context-length", "32768", "--page-size", "1"}, 20480, 20474, 32768, "null"},
		{[]string{"--pool-tokens", "4100", "--context-length", "8192", "--page-size", "64"}, 4096, 4090, 8192, "null"},
		{[]string{"--pool-tokens", "65536", "--context-length", "4096", "--page-size", "64"}, 65536, 4090, 4096, "null"},
		{[]string{"--mode", "prefill", "--bootstrap-port", "0", "--pool-tokens", "1000", "--context-length", "8192", "--page-size", "16"}, 992, 986, 8192, "prefill"},
	}
	for _, c := range cases {
		sim := procs.StartSim(t, c.args...)
		var info struct {
			Pool     int    `json:"max_total_num_tokens"`
			Mril     int    `json:"max_req_input_len"`
			CtxFlag  *int   `json:"context_length"`
			Mode     string `json:"disaggregation_mode"`
			BootPort int    `json:"disaggregation_bootstrap_port"`
			Internal []struct {
				Mem struct {
					Cap int `json:"token_capacity"`
				} `json:"memory_usage"`
			} `json:"internal_states"`
		}
		getJSON(t, sim.URL+"/server_info", &info)
		var models struct {
			Data []struct {
				MaxModelLen int `json:"max_model_len"`
			} `json:"data"`
		}
		getJSON(t, sim.URL+"/v1/models", &models)
		if info.Pool != c.pool || info.Mril != c.mril || info.CtxFlag != nil || info.Mode != c.mode ||
			len(info.Internal) != 1 || info.Internal[0].Mem.Cap != c.pool || len(models.Data) != 1 || models.Data[0].MaxModelLen != c.ctx {
			t.Errorf("%v: server_info %+v models %+v", c.args, info, models)
		}
		if c.mode == "prefill" && (sim.BootstrapPort == 0 || sim.BootstrapPort != info.BootPort) {
			t.Errorf("prefill bootstrap port %d, reported %d", sim.BootstrapPort, info.BootPort)
		}
		var old struct {
			Mril int `json:"max_req_input_len"`
		}
		getJSON(t, sim.URL+"/get_server_info", &old)
		if old.Mril != c.mril {
			t.Errorf("/get_server_info max_req_input_len %d", old.Mril)
		}
		sim.Stop()
	}
}

func TestNormalRequestsNeverReadForeignSlots(t *testing.T) {
	// A small pool so that pages are reused constantly.
	sim := procs.StartSim(t, "--pool-tokens", "2048", "--context-length", "4096", "--page-size", "16", "--bug", "admit-rejected")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				m := marker(w*100 + i)
				r := post(t, sim.URL, "/generate", map[string]any{"text": warmText(m, 10+(i*7+w*13)%150),
					"sampling_params": map[string]any{"max_new_tokens": 48}})
				txt := ""
				if r.status == 200 {
					txt = genText(t, r)
				}
				mu.Lock()
				if r.status != 200 || r.header.Get("X-Sim-Foreign-Requests") != "" {
					bad = append(bad, fmt.Sprintf("%d %s foreign=%q", r.status, r.body, r.header.Get("X-Sim-Foreign-Requests")))
				}
				// A clean reply quotes only its own prompt.
				for _, word := range strings.Fields(txt) {
					if strings.HasPrefix(word, "KVG-") && word != m {
						bad = append(bad, "foreign marker "+word)
					}
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d bad replies, first: %s", len(bad), bad[0])
	}
	if st := sim.Stats(t); st.Pool.PagesFree != st.Pool.PagesTotal || st.Pool.PagesTotal != 128 {
		t.Errorf("pages leaked: %+v", st.Pool)
	}
}

func TestPDNormalRequestsAreClean(t *testing.T) {
	pre := procs.StartSim(t, withFlags(prefillArgs, "--bug", "admit-rejected")...)
	dec := procs.StartSim(t, decodeArgs...)
	for i := 0; i < 6; i++ {
		p, d := pdPost(t, pre, dec, "/v1/chat/completions", map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": warmText(marker(i), 20+30*i)}}, "max_tokens": 32}, 50+i)
		if p.status != 200 || d.status != 200 || d.header.Get("X-Sim-Foreign-Requests") != "" {
			t.Fatalf("normal PD request %d: prefill %d, decode %d %s foreign=%q", i, p.status, d.status, d.body, d.header.Get("X-Sim-Foreign-Requests"))
		}
		for _, word := range strings.Fields(chatText(t, d)) {
			if strings.Contains(word, "KVG-") && !strings.Contains(word, marker(i)) {
				t.Errorf("normal PD request %d quotes %q", i, word)
			}
		}
	}
}

func TestSimStatsCountWhatArrived(t *testing.T) {
	sim := procs.StartSim(t, "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16", "--tokenizer", "chunk4")
	for i := 0; i < 3; i++ {
		post(t, sim.URL, "/generate", map[string]any{"text": strings.Repeat("abcd", 10+i)})
	}
	post(t, sim.URL, "/generate", map[string]any{"text": strings.Repeat("abcd", 5000)}) // refused: context
	post(t, sim.URL, "/v1/completions", map[string]any{"prompt": "ab cd", "max_tokens": 3})
	post(t, sim.URL, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}})
	post(t, sim.URL, "/v1/chat/completions", map[string]any{"messages": "not a list"}) // refused: bad request
	// A batch and n > 1 are still one request each.
	if r := post(t, sim.URL, "/generate", map[string]any{"text": []string{"ab", "cd ef"}, "sampling_params": map[string]any{"max_new_tokens": 2}}); r.status != 200 || !strings.HasPrefix(string(r.body), "[") {
		t.Errorf("batched /generate: %d %s", r.status, r.body)
	}
	r := post(t, sim.URL, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x y"}}, "n": 2, "max_tokens": 2})
	if r.status != 200 || strings.Count(string(r.body), `"index"`) != 2 {
		t.Errorf("chat n=2: %d %s", r.status, r.body)
	}
	for i := 0; i < 2; i++ {
		r := post(t, sim.URL, "/tokenize", map[string]any{"prompt": "abcdefgh ij"})
		if !strings.Contains(string(r.body), `"count":4`) {
			t.Errorf("/tokenize with chunk4: %s", r.body)
		}
	}
	st := sim.Stats(t)
	if st.Requests["/generate"] != 5 || st.Requests["/v1/completions"] != 1 || st.Requests["/v1/chat/completions"] != 3 ||
		st.MaxPromptTokens != 5000 || st.TokenizeRequests != 2 || st.Rejected["context"] != 1 || st.Rejected["bad_request"] != 1 ||
		st.Pool.PagesTotal != 64 || st.Pool.PagesFree != 64 {
		t.Errorf("stats = %+v", st)
	}
}

func TestStreamsFlushEachToken(t *testing.T) {
	sim := procs.StartSim(t, "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16", "--token-delay", "60ms", "--tokenizer", "chunk4")
	body, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": "one two three four five six seven"}},
		"max_tokens": 5, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	start := time.Now()
	resp, err := client.Post(sim.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, ok := resp.Header["X-Sim-Foreign-Requests"]; !ok {
		t.Errorf("stream reply lacks X-Sim-Foreign-Requests")
	}
	sc := bufio.NewScanner(resp.Body)
	var arrivals []time.Duration
	var content strings.Builder
	sawUsage, sawDone := false, false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			sawDone = true
			continue
		}
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil || ch.Object != "chat.completion.chunk" {
			t.Fatalf("bad chunk %q: %v", line, err)
		}
		if ch.Usage != nil {
			sawUsage = ch.Usage.CompletionTokens == 5 && len(ch.Choices) == 0
			continue
		}
		if len(ch.Choices) == 1 && ch.Choices[0].Delta.Content != "" {
			arrivals = append(arrivals, time.Since(start))
			content.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if len(arrivals) != 5 || !sawUsage || !sawDone {
		t.Fatalf("got %d content chunks (usage %v, done %v): %q", len(arrivals), sawUsage, sawDone, content.String())
	}
	// Each token is delivered as produced: the first one well before the
	// last, and consecutive ones about a delay apart.
	if arrivals[4]-arrivals[0] < 180*time.Millisecond {
		t.Errorf("tokens arrived together, not one by one: %v", arrivals)
	}

	// /generate streams cumulative text.
	body, _ = json.Marshal(map[string]any{"text": "alpha beta gamma", "stream": true, "sampling_params": map[string]any{"max_new_tokens": 3}})
	r := post(t, sim.URL, "/generate", json.RawMessage(body))
	var prev string
	events := 0
	for _, ev := range strings.Split(string(r.body), "\n\n") {
		line, ok := strings.CutPrefix(ev, "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var g struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			t.Fatalf("bad event %q", line)
		}
		if !strings.HasPrefix(g.Text, prev) || len(g.Text) <= len(prev) {
			t.Errorf("text is not cumulative: %q after %q", g.Text, prev)
		}
		prev = g.Text
		events++
	}
	if events != 3 || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Errorf("generate stream: %d events: %s", events, r.body)
	}
}

func TestAPIKeyAndLoopbackOnlyBootstrap(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16", "--api-key", "sekrit")
	if r := post(t, sim.URL, "/generate", map[string]any{"text": "x"}); r.status != 401 {
		t.Errorf("no key: %d", r.status)
	}
	if r := post(t, sim.URL, "/generate", map[string]any{"text": "x"}, "Authorization", "Bearer wrong"); r.status != 401 {
		t.Errorf("wrong key: %d", r.status)
	}
	r := post(t, sim.URL, "/generate", map[string]any{"text": "hello", "bootstrap_host": "10.1.2.3", "bootstrap_port": 8998, "bootstrap_room": 1},
		"Authorization", "Bearer sekrit")
	if r.status != 400 || !strings.Contains(string(r.body), "loopback") {
		t.Errorf("non-loopback bootstrap_host: %d %s", r.status, r.body)
	}
	if st := sim.Stats(t); st.Rejected["bootstrap_host"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestAbortReachesWaitingDecode(t *testing.T) {
	dec := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16", "--transfer-timeout", "10s")
	pre := procs.StartSim(t, "--mode", "prefill", "--bootstrap-port", "0", "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16")
	done := make(chan reply, 1)
	go func() {
		done <- post(t, dec.URL, "/generate", map[string]any{"text": "waiting for KV", "rid": "r-abort",
			"bootstrap_host": "127.0.0.1", "bootstrap_port": pre.BootstrapPort, "bootstrap_room": 77})
	}()
	time.Sleep(200 * time.Millisecond) // decode is now waiting on the room
	if r := post(t, dec.URL, "/abort_request", map[string]any{"rid": "r-abort", "abort_all": false}); r.status != 200 {
		t.Fatalf("abort_request: %d", r.status)
	}
	select {
	case r := <-done:
		if !strings.Contains(string(r.body), `"abort"`) {
			t.Errorf("aborted decode answered %d %s", r.status, r.body)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("abort did not reach the waiting decode")
	}
	if st := dec.Stats(t); st.Pool.PagesFree != st.Pool.PagesTotal {
		t.Errorf("aborted request kept its pages: %+v", st.Pool)
	}
}
