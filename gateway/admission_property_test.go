package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Issue 15's property: whatever an engine's /server_info, /v1/models, /v1/loads and /tokenize
// say (failing, lying with numbers of every type and sign, inconsistent limits, changing at
// random times), no engine ever receives a prompt over its max_req_input_len or its pool.
// Ground truth is each simulator's /sim/stats (the largest prompt that arrived, and its length
// rejections), not anything the gateway reports.
//
// Every engine sits behind a lyingEngine: a loopback proxy that forwards generation routes to
// the real simulator and rewrites its info and /tokenize answers on a seeded schedule. One lie
// is left out on purpose: raising every statement of the pool at once (top level, each DP rank,
// and the limits derived from it) consistently. That is indistinguishable from a larger engine,
// to kvgate or anyone; every inconsistent lie is in.
func TestAdmissionHoldsAgainstLyingEngines(t *testing.T) {
	seed := int64(15)
	if s := os.Getenv("KVGATE_PROPERTY_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (set KVGATE_PROPERTY_SEED to replay)", seed)
	for _, tc := range []struct {
		tokenizer string
		// chunk4 tokens of prose per engine token: chunk4 counts this prose at ~2.4× cl100k.
		scale float64
	}{{"chunk4", 1}, {"cl100k", 2.4}} {
		t.Run(tc.tokenizer, func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			common := []string{"--tokenizer", tc.tokenizer, "--page-size", "16"}
			// Pools smaller than the context (the incident's shape), asymmetric across the pair,
			// whose limit (the prefill's) is above the unified engine's so that it serves too; the
			// prefill has the leak bug, so a prompt admitted over its pool is served (and leaks).
			uni := procs.StartSim(t, append([]string{"--mode", "combined", "--pool-tokens", "4096", "--context-length", "16384"}, common...)...)
			pre := procs.StartSim(t, append([]string{"--mode", "prefill", "--pool-tokens", "5120", "--context-length", "16384",
				"--bootstrap-port", "0", "--bug", "admit-rejected"}, common...)...)
			dec := procs.StartSim(t, append([]string{"--mode", "decode", "--pool-tokens", "6144", "--context-length", "16384"}, common...)...)
			engines := []*lyingEngine{
				newLyingEngine(t, "u", uni, rng.Int63()), newLyingEngine(t, "p", pre, rng.Int63()), newLyingEngine(t, "d", dec, rng.Int63()),
			}
			cfg := gatewayYAML("policy: {mode: enforce}\ntokenizer: {exact_timeout: 1s, calibration_retry_max: 800ms}\n",
				[3]string{"u", engines[0].url, "unified"}, [3]string{"p", engines[1].url, "prefill"}, [3]string{"d", engines[2].url, "decode"})
			gw := testkit.StartGateway(t, testkit.ParseConfig(t, cfg))

			limits := []int{engines[0].mril, min(engines[1].mril, engines[2].mril)}
			outcomes := map[string]int{}
			// Requests are paced so that the engines' answers change between them (they are
			// redrawn on the gateway's polls, every 200 ms).
			pace := time.NewTicker(30 * time.Millisecond)
			defer pace.Stop()
			const requests = 200
			for i := 0; i < requests; i++ {
				<-pace.C
				limit := limits[rng.Intn(len(limits))]
				// Engine counts from 80% to 125% of a path's limit: the gray zone and both sides.
				target := int(float64(limit) * (0.8 + 0.45*rng.Float64()) * tc.scale)
				text, n := prose(rng, target) // n: the chunk4 count (the engine's, for chunk4)
				route := propertyRoutes[rng.Intn(len(propertyRoutes))]
				r := post(t, gw.URL, route.path, tenantKey, route.body(text, 1+rng.Intn(8)))
				outcomes[fmt.Sprintf("%s %d", route.path, r.status)]++
				outcomes[fmt.Sprint(r.status)]++
				switch r.status {
				case 200:
					if tc.tokenizer == "chunk4" && n >= limits[0] {
						outcomes["admitted over the unified limit (so to the pair)"]++
					}
				case 413, 503:
					outcomes[fmt.Sprint(r.status, " ", checkEnvelope(t, route.path, r))]++
				case 500:
					t.Fatalf("%s: 500 %s", route.path, r.body)
				default: // the engine's own refusal, passed through: the stats below say why
					t.Logf("%s: %d after tier %s counted %s tokens: %.200s", route.path, r.status,
						r.header.Get("X-Kvgate-Tier"), r.header.Get("X-Kvgate-Tokens"), r.body)
				}
			}
			served := map[string]int{}
			for _, e := range engines {
				st := e.sim.Stats(t)
				for _, n := range st.Requests {
					served[e.name] += n
				}
				bad := st.Rejected["pool"] + st.Rejected["context"] + st.Rejected["total"] + st.Rejected["pool_admitted_stub"]
				if st.MaxPromptTokens >= e.mril || st.MaxPromptTokens > e.pool || bad != 0 {
					t.Errorf("engine %s (max_req_input_len %d, pool %d) received a prompt of %d tokens; length rejections %v",
						e.name, e.mril, e.pool, st.MaxPromptTokens, st.Rejected)
				}
				t.Logf("engine %s: largest prompt %d (max_req_input_len %d), requests %v, lies told %v",
					e.name, st.MaxPromptTokens, e.mril, st.Requests, e.toldCounts())
			}
			t.Logf("outcomes: %v; requests served per engine: %v", outcomes, served)
			// The run must have exercised every outcome, or it proves little.
			if outcomes["200"] < 10 || outcomes["413"] == 0 || outcomes["503 count_unavailable"] == 0 || served["p"] == 0 || served["u"] == 0 {
				t.Errorf("too few admits, refusals or fail-closed answers to mean anything: %v", outcomes)
			}
		})
	}
}

// checkEnvelope: every refusal is kvgate's own error in the route's envelope. It returns the
// code (Anthropic's envelope has none: its type).
func checkEnvelope(t *testing.T, path string, r reply) string {
	t.Helper()
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Message, Type string
			Code          *string
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || body.Error.Message == "" || body.Error.Type == "" {
		t.Fatalf("%s %d: not an error envelope: %s", path, r.status, r.body)
	}
	if r.status == 503 && r.header.Get("Retry-After") == "" {
		t.Fatalf("%s 503 without Retry-After: %s", path, r.body)
	}
	if path == "/v1/messages" {
		if body.Type != "error" {
			t.Fatalf("%s %d: not Anthropic's envelope: %s", path, r.status, r.body)
		}
		return body.Error.Type
	}
	if body.Error.Code == nil {
		t.Fatalf("%s %d: no code: %s", path, r.status, r.body)
	}
	return *body.Error.Code
}

// propertyRoutes are every route that carries a prompt to an engine, with the prompt text in
// its place and output tokens requested where the route generates.
var propertyRoutes = []struct {
	path string
	body func(text string, out int) string
}{
	{"/v1/chat/completions", func(s string, o int) string {
		return fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, s, o)
	}},
	{"/v1/completions", func(s string, o int) string { return fmt.Sprintf(`{"model":"sim","prompt":%q,"max_tokens":%d}`, s, o) }},
	{"/generate", func(s string, o int) string {
		return fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":%d}}`, s, o)
	}},
	{"/v1/responses", func(s string, o int) string {
		return fmt.Sprintf(`{"model":"sim","input":%q,"max_output_tokens":%d}`, s, o)
	}},
	{"/v1/messages", func(s string, o int) string {
		return fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":%d}`, s, o)
	}},
	{"/v1/embeddings", func(s string, _ int) string { return fmt.Sprintf(`{"model":"sim","input":%q}`, s) }},
	{"/v1/rerank", func(s string, _ int) string {
		return fmt.Sprintf(`{"model":"sim","query":"capital","documents":[%q]}`, s)
	}},
	{"/v1/score", func(s string, _ int) string { return fmt.Sprintf(`{"model":"sim","query":"capital","items":[%q]}`, s) }},
	{"/v1/classify", func(s string, _ int) string { return fmt.Sprintf(`{"model":"sim","input":%q}`, s) }},
	{"/encode", func(s string, _ int) string { return fmt.Sprintf(`{"text":%q}`, s) }},
	{"/classify", func(s string, _ int) string { return fmt.Sprintf(`{"text":%q}`, s) }},
}

// lyingEngine is a loopback HTTP proxy in front of one simulator. Generation routes pass
// through untouched; /server_info, /get_server_info, /v1/models, /v1/loads and /tokenize are
// fetched from the simulator and answered as the current behaviour of their kind says. Each
// call redraws that behaviour with probability 1/4, so lies start and stop at random times.
// /tokenize answers 404 for the first second (an engine whose tokenizer comes up late).
type lyingEngine struct {
	name      string
	sim       *procs.Sim
	url       string
	mril      int // the simulator's own numbers
	pool      int
	tokDownTo time.Time

	mu      sync.Mutex
	rng     *rand.Rand
	current map[string]string
	told    map[string]int
}

// Lies by kind; each draw is "honest" with probability honesty, else one of these.
var lies = map[string][]string{
	"info": {"404", "500", "garbage", "truncated",
		"mril_string", "mril_float", "mril_negative", "mril_zero", "mril_huge", "mril_bool", "mril_null", "pool_string",
		"pool_negative", "pool_zero", "pool_exp", "rank_pool_string", "page_negative", "port_out_of_range",
		"mril_above_pool", "pool_inflated", "mril_and_pool_inflated", "context_flag_inflated", "mril_smaller", "wrong_role"},
	"models": {"404", "500", "garbage", "ctx_string", "ctx_negative", "ctx_zero",
		"ctx_float", "ctx_inflated", "extra_model_inflated", "no_models"},
	"loads": {"500", "garbage", "used_negative", "used_huge", "used_string", "total_inflated"},
	"tokenize": {"404", "500", "garbage", "count_negative", "count_string",
		"count_float", "count_zero", "count_one", "count_huge", "count_disagrees", "count_over_bytes"},
}

func newLyingEngine(t *testing.T, name string, sim *procs.Sim, seed int64) *lyingEngine {
	t.Helper()
	e := &lyingEngine{name: name, sim: sim, rng: rand.New(rand.NewSource(seed)), current: map[string]string{}, told: map[string]int{},
		tokDownTo: time.Now().Add(time.Second)}
	var info map[string]any
	if err := json.Unmarshal(e.fetch("GET", "/server_info", nil), &info); err != nil {
		t.Fatal(err)
	}
	e.mril, e.pool = int(info["max_req_input_len"].(float64)), int(info["max_total_num_tokens"].(float64))
	target, _ := url.Parse(sim.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := map[string]string{"/server_info": "info", "/get_server_info": "info", "/v1/models": "models",
			"/v1/loads": "loads", "/get_load": "loads", "/tokenize": "tokenize"}[r.URL.Path]
		if kind == "" {
			rp.ServeHTTP(w, r)
			return
		}
		in, _ := io.ReadAll(r.Body)
		lie := e.draw(kind)
		if kind == "tokenize" && time.Now().Before(e.tokDownTo) {
			lie = "404"
		}
		real := e.fetch(r.Method, map[string]string{"info": "/server_info", "models": "/v1/models", "loads": "/v1/loads", "tokenize": "/tokenize"}[kind], in)
		status, body := e.tell(kind, lie, real, in)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// fetch is the simulator's real answer (nil when it cannot be reached: then the lie is garbage).
func (e *lyingEngine) fetch(method, path string, body []byte) []byte {
	req, _ := http.NewRequest(method, e.sim.URL+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

func (e *lyingEngine) draw(kind string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.current[kind]; !ok || e.rng.Intn(4) == 0 {
		e.current[kind] = "honest"
		if e.rng.Float64() >= honesty {
			e.current[kind] = lies[kind][e.rng.Intn(len(lies[kind]))]
		}
	}
	lie := e.current[kind]
	e.told[kind+":"+lie]++
	return lie
}

func (e *lyingEngine) toldCounts() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int{}
	for k, v := range e.told {
		if !strings.HasSuffix(k, ":honest") {
			out[k] = v
		}
	}
	return out
}

// tell rewrites the simulator's real answer (a JSON object) as lie says.
func (e *lyingEngine) tell(kind, lie string, real, request []byte) (int, []byte) {
	switch lie {
	case "honest":
		return 200, real
	case "404":
		return 404, []byte(`{"detail":"Not Found"}`)
	case "500":
		return 500, []byte(`{"error":{"message":"internal"}}`)
	case "garbage":
		return 200, []byte(`<html>upstream connect error</html>`)
	case "truncated":
		return 200, real[:len(real)/2]
	}
	if real == nil {
		return 502, nil
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(real))
	d.UseNumber()
	if d.Decode(&m) != nil {
		return 200, real
	}
	num := func(v any) int { n, _ := strconv.Atoi(fmt.Sprint(v)); return n }
	pool, mril := e.pool, e.mril
	models := func(f func(entry map[string]any)) {
		if data, ok := m["data"].([]any); ok && len(data) > 0 {
			f(data[0].(map[string]any))
		}
	}
	rank := func(f func(mem map[string]any)) {
		if st, ok := m["internal_states"].([]any); ok && len(st) > 0 {
			f(st[0].(map[string]any)["memory_usage"].(map[string]any))
		}
	}
	loads := func(f func(l map[string]any)) {
		if ls, ok := m["loads"].([]any); ok && len(ls) > 0 {
			f(ls[0].(map[string]any))
		}
	}
	switch lie {
	case "mril_string":
		m["max_req_input_len"] = strconv.Itoa(mril * 10)
	case "mril_float":
		m["max_req_input_len"] = json.Number(fmt.Sprintf("%d.5", mril*10))
	case "mril_negative":
		m["max_req_input_len"] = -mril
	case "mril_zero":
		m["max_req_input_len"] = 0
	case "mril_huge":
		m["max_req_input_len"] = json.Number("1e30")
	case "mril_bool":
		m["max_req_input_len"] = true
	case "mril_null":
		m["max_req_input_len"] = nil
	case "pool_string":
		m["max_total_num_tokens"] = "lots"
	case "pool_negative":
		m["max_total_num_tokens"] = -pool
	case "pool_zero":
		m["max_total_num_tokens"] = 0
	case "pool_exp":
		m["max_total_num_tokens"] = json.Number("4e6")
	case "rank_pool_string":
		rank(func(mem map[string]any) { mem["token_capacity"] = strconv.Itoa(pool) })
	case "page_negative":
		m["page_size"] = -16
	case "port_out_of_range":
		m["disaggregation_bootstrap_port"] = 99999999999
	case "mril_above_pool": // issue 15's engine
		m["max_req_input_len"] = 100000
	case "pool_inflated": // the top level says more than the ranks
		m["max_total_num_tokens"] = pool * 10
	case "mril_and_pool_inflated":
		m["max_total_num_tokens"], m["max_req_input_len"] = pool*10, pool*10-6
	case "context_flag_inflated":
		m["context_length"] = 1 << 20
	case "mril_smaller":
		m["max_req_input_len"] = mril / 2
	case "wrong_role":
		m["disaggregation_mode"] = map[string]any{"null": "prefill", "prefill": "decode", "decode": "null"}[fmt.Sprint(m["disaggregation_mode"])]
	case "ctx_string":
		models(func(x map[string]any) { x["max_model_len"] = "16384" })
	case "ctx_negative":
		models(func(x map[string]any) { x["max_model_len"] = -16384 })
	case "ctx_zero":
		models(func(x map[string]any) { x["max_model_len"] = 0 })
	case "ctx_float":
		models(func(x map[string]any) { x["max_model_len"] = 16384.5 })
	case "ctx_inflated":
		models(func(x map[string]any) { x["max_model_len"] = 1 << 24 })
	case "extra_model_inflated":
		m["data"] = append(m["data"].([]any), map[string]any{"id": "lora", "max_model_len": 1 << 24})
	case "no_models":
		m["data"] = []any{}
	case "used_negative":
		loads(func(l map[string]any) { l["num_used_tokens"] = -1 << 40 })
	case "used_huge":
		loads(func(l map[string]any) { l["num_used_tokens"] = json.Number("1e300") })
	case "used_string":
		loads(func(l map[string]any) { l["num_used_tokens"] = "0" })
	case "total_inflated":
		loads(func(l map[string]any) { l["max_total_num_tokens"] = pool * 100 })
	case "count_negative":
		m["count"], m["tokens"] = -num(m["count"]), nil
	case "count_string":
		m["count"], m["tokens"] = fmt.Sprint(m["count"]), nil
	case "count_float":
		m["count"], m["tokens"] = json.Number(fmt.Sprintf("%d.5", num(m["count"])/3)), nil
	case "count_zero":
		m["count"], m["tokens"] = 0, nil
	case "count_one":
		m["count"], m["tokens"] = 1, nil
	case "count_huge":
		m["count"], m["tokens"] = json.Number("1000000000000"), nil
	case "count_disagrees":
		m["count"] = num(m["count"]) / 4
	case "count_over_bytes":
		var q struct{ Prompt string }
		_ = json.Unmarshal(request, &q)
		m["count"], m["tokens"] = len(q.Prompt)*2+10, nil
	}
	out, _ := json.Marshal(m)
	return 200, out
}

// honesty is the probability that a draw tells the truth: lies often enough to matter, truth
// often enough that requests are admitted and served.
const honesty = 0.8

// Issue 15's second finding, alone: a chunk4 engine whose /tokenize answers 404 at calibration
// (its tokenizer comes up after its /server_info). Before: never distrusted, never recalibrated,
// and an estimate admitted prompts the engine then rejected. Now: while /tokenize is down, a
// prompt over the byte bound gets 503 count_unavailable (never the engine); once it is up,
// calibration is retried and succeeds, and exact counts decide both ways.
func TestCalibrationDownAtStartFailsClosedThenRetries(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "chunk4", "--pool-tokens", "4096", "--context-length", "16384", "--page-size", "16")
	target, _ := url.Parse(sim.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	tokenizerUp := false
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		up := tokenizerUp
		mu.Unlock()
		if r.URL.Path == "/tokenize" && !up {
			http.Error(w, `{"detail":"Not Found"}`, 404)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("policy: {mode: enforce}\ntokenizer: {calibration_retry_max: 400ms}\n",
		[3]string{"sim", proxy.URL, "unified"})))
	const mril = 4090
	rng := rand.New(rand.NewSource(4))
	over, nOver := prose(rng, 4600) // cl100k estimate ~1,900: × 1.3 would admit
	fits, nFits := prose(rng, 3000) // over the byte bound (~6 KB), under the limit
	if nOver < mril || nFits >= mril || len(fits) < mril {
		t.Fatalf("prompts not where the test needs them: %d, %d tokens, %d bytes", nOver, nFits, len(fits))
	}
	body := func(s string) string { return fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":1}}`, s) }
	for _, text := range []string{over, fits} {
		r := post(t, gw.URL, "/generate", tenantKey, body(text))
		if r.status != 503 || checkEnvelope(t, "/generate", r) != "count_unavailable" {
			t.Fatalf("tokenizer down: want 503 count_unavailable, got %d %s", r.status, r.body)
		}
	}
	mu.Lock()
	tokenizerUp = true
	mu.Unlock()
	eventually(t, 5*time.Second, "calibration retried and succeeded", func() bool {
		return strings.Contains(string(get(t, gw.URL+"/metrics", "admin-key").body), `kvgate_tokenizer_calibrations_total{backend="sim",result="ok"} 1`)
	})
	if r := post(t, gw.URL, "/generate", tenantKey, body(over)); r.status != 413 {
		t.Fatalf("%d-token prompt: want 413, got %d %s", nOver, r.status, r.body)
	}
	if r := post(t, gw.URL, "/generate", tenantKey, body(fits)); r.status != 200 || r.header.Get("X-Kvgate-Tier") != "exact" {
		t.Fatalf("%d-token prompt: want 200 by exact count, got %d (%s) %s", nFits, r.status, r.header.Get("X-Kvgate-Tier"), r.body)
	}
	if st := sim.Stats(t); st.MaxPromptTokens >= mril || len(st.Rejected) != 0 {
		t.Fatalf("the engine received a prompt over its limit: %d, rejected %v", st.MaxPromptTokens, st.Rejected)
	}
}

// Issue 15's third finding through a whole gateway: an engine reporting max_req_input_len
// 100,000 over a 4,006-token pool had 99,999 advertised and a 30,000-token prompt admitted. Now
// /v1/models advertises no more than the pool, the prompt is a 413 that never reaches the engine,
// and the reading raises the pool alarm metric.
func TestInconsistentLimitsAreHeldToThePool(t *testing.T) {
	var generated sync.Mutex
	calls := 0
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/server_info":
			fmt.Fprint(w, `{"max_total_num_tokens":4006,"max_req_input_len":100000,"page_size":1,"disaggregation_mode":"null"}`)
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","max_model_len":100000}]}`)
		case "/generate":
			generated.Lock()
			calls++
			generated.Unlock()
			fmt.Fprint(w, `{"text":"ok","meta_info":{"prompt_tokens":1,"completion_tokens":1}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(eng.Close)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("policy: {mode: enforce}\n", [3]string{"eng", eng.URL, "unified"})))
	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		}
	}
	if r := get(t, gw.URL+"/v1/models", tenantKey); json.Unmarshal(r.body, &models) != nil || len(models.Data) != 1 || models.Data[0].MaxModelLen > 4006 {
		t.Fatalf("advertised more than the 4,006-token pool: %s", r.body)
	}
	ids := strings.TrimSuffix(strings.Repeat("7,", 30000), ",")
	if r := post(t, gw.URL, "/generate", tenantKey, `{"input_ids":[`+ids+`],"sampling_params":{"max_new_tokens":1}}`); r.status != 413 {
		t.Fatalf("30,000 tokens over a 4,006-token pool: want 413, got %d %.300s", r.status, r.body)
	}
	generated.Lock()
	defer generated.Unlock()
	if calls != 0 {
		t.Fatalf("the engine received %d requests", calls)
	}
	if m := get(t, gw.URL+"/metrics", "admin-key").body; !strings.Contains(string(m), `kvgate_backend_pool_below_context{backend="eng"} 1`) {
		t.Fatal("no pool alarm for an inconsistent reading")
	}
}
