package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// limitsYAML: tenant alice (key tenantKey) with the given limits, and bob (sk-bob) without,
// sharing Redis state under prefix at redisURL.
func limitsYAML(redisURL, prefix, limits, extra string, sim string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "backends:\n  - {name: sim, url: %q, role: unified}\n", sim)
	fmt.Fprintf(&b, "tenants:\n  - {name: alice, key_sha256: %q, %s}\n", testkit.KeySHA256(tenantKey), limits)
	fmt.Fprintf(&b, "  - {name: bob, key_sha256: %q}\n", testkit.KeySHA256("sk-bob"))
	fmt.Fprintf(&b, "admin_key_sha256: %q\n", testkit.KeySHA256("admin-key"))
	b.WriteString("capacity: {poll_interval: 200ms}\n")
	if redisURL != "" {
		fmt.Fprintf(&b, "state: {redis_url: %q, key_prefix: %q}\n", redisURL, prefix)
	}
	b.WriteString(extra)
	return b.String()
}

// twoReplicas starts two gateways with the same configuration (so the same Redis and prefix).
func twoReplicas(t *testing.T, yaml string) [2]*testkit.Gateway {
	t.Helper()
	return [2]*testkit.Gateway{testkit.StartGateway(t, testkit.ParseConfig(t, yaml)), testkit.StartGateway(t, testkit.ParseConfig(t, yaml))}
}

// metric sums the samples of name whose labels contain every one of want.
func metric(t *testing.T, url, name string, want ...string) float64 {
	t.Helper()
	r := get(t, url+"/metrics", "admin-key")
	var sum float64
	re := regexp.MustCompile(`^` + name + `(\{[^}]*\})? (\S+)$`)
	for _, line := range strings.Split(string(r.body), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(m[1], w)
		}
		if ok {
			v, _ := strconv.ParseFloat(m[2], 64)
			sum += v
		}
	}
	return sum
}

// checkRateLimited asserts a 429 in OpenAI's envelope with a Retry-After.
func checkRateLimited(t *testing.T, r reply, typ string) {
	t.Helper()
	if r.status != 429 {
		t.Fatalf("want 429, got %d %s", r.status, r.body)
	}
	e := decodeError(t, r)
	if e.Error.Type != typ || e.Error.Code != "rate_limit_exceeded" || e.Error.Param != nil {
		t.Fatalf("429 envelope: %s", r.body)
	}
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("429 without a Retry-After: %v", r.header)
	}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const smallChat = `{"model":"sim","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`

// rpm 20 over two replicas sharing Redis: 100 requests spread over both get 20 (plus the refill
// of 1 per 3 s) and the rest 429s that never reach the engine; a prompt that can never fit is
// still a 413.
func TestLimitRPMAcrossReplicas(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gws := twoReplicas(t, limitsYAML(testRedisURL(), uniquePrefix(t), "rpm: 20", "", sim.URL))
	before := sim.Stats(t).Requests["/v1/chat/completions"]
	start := time.Now()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				r := post(t, gws[(w+i)%2].URL, "/v1/chat/completions", tenantKey, smallChat)
				if r.status == 429 {
					checkRateLimited(t, r, "requests")
				}
				mu.Lock()
				codes[r.status]++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	refill := int(time.Since(start)/(3*time.Second)) + 1
	if codes[200] < 20 || codes[200] > 20+refill || codes[200]+codes[429] != 100 {
		t.Fatalf("rpm 20 over two replicas: %v (refill allowance %d)", codes, refill)
	}
	if got := sim.Stats(t).Requests["/v1/chat/completions"] - before; got != codes[200] {
		t.Fatalf("the engine saw %d requests; only the %d admitted may reach it", got, codes[200])
	}
	limited := metric(t, gws[0].URL, "kvgate_ratelimited_total", `tenant="alice"`, `limit="rpm"`) +
		metric(t, gws[1].URL, "kvgate_ratelimited_total", `tenant="alice"`, `limit="rpm"`)
	if int(limited) != codes[429] {
		t.Fatalf("kvgate_ratelimited_total = %v, want %d", limited, codes[429])
	}
	// Out of requests, but a prompt that can never fit is a 413, not a 429.
	huge := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":4}`, words(9000))
	if r := post(t, gws[1].URL, "/v1/chat/completions", tenantKey, huge); r.status != 413 {
		t.Fatalf("oversized prompt over the rate limit: %d %s", r.status, r.body)
	}
	// Another tenant is not affected.
	if r := post(t, gws[0].URL, "/v1/chat/completions", "sk-bob", smallChat); r.status != 200 {
		t.Fatalf("bob has no limits: %d %s", r.status, r.body)
	}
}

// streamUsage posts a streaming request and returns the status, the usage the reply reported
// (prompt + completion) and the prompt tokens kvgate reserved.
func streamUsage(t *testing.T, url, path, body string) (int, int64, int64) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	reserved, _ := strconv.ParseInt(resp.Header.Get("X-Kvgate-Tokens"), 10, 64)
	if resp.StatusCode != 200 {
		r := reply{status: resp.StatusCode, header: resp.Header}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			r.body = append(r.body, sc.Bytes()...)
		}
		checkRateLimited(t, r, "tokens")
		return resp.StatusCode, 0, reserved
	}
	var used int64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
			Meta *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"meta_info"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			t.Fatalf("bad event %q", data)
		}
		if ev.Meta != nil {
			used = ev.Meta.PromptTokens + ev.Meta.CompletionTokens // cumulative
		}
		if ev.Usage != nil {
			used = ev.Usage.PromptTokens + ev.Usage.CompletionTokens
		}
	}
	if used == 0 {
		t.Fatalf("%s: the stream reported no usage", path)
	}
	return 200, used, reserved
}

// tpm over two replicas with streamed replies: each request reserves its prompt (an upper bound)
// plus max_tokens and is settled from the usage its stream reported, so the refunds admit more
// requests than the reservations alone would, and what was charged is exactly what was used.
func TestLimitTPMStreamsSettledFromUsage(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	const tpm, maxTokens = 2000, 40
	gws := twoReplicas(t, limitsYAML(testRedisURL(), uniquePrefix(t), "tpm: 2000", "", sim.URL))
	prompt := strings.Repeat("a fine sentence of plain words. ", 6) // ~190 bytes, far fewer tokens
	bodies := map[string]string{
		"/v1/chat/completions": fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, prompt, maxTokens),
		"/generate":            fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":%d},"stream":true}`, prompt, maxTokens),
	}
	start := time.Now()
	var admitted int
	var usedSum, maxReserve int64
	refused := false
	for i := 0; i < 60 && !refused; i++ {
		path := "/v1/chat/completions"
		if i%3 == 2 {
			path = "/generate"
		}
		gw := gws[i%2]
		settledBefore := metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`)
		code, used, reserved := streamUsage(t, gw.URL, path, bodies[path])
		if code != 200 {
			refused = true
			break
		}
		admitted++
		usedSum += used
		maxReserve = max(maxReserve, reserved+maxTokens)
		// The stream's end settles it (when fasthttp closes the body, just after the client's
		// last byte): wait for that before the next request so the count is deterministic.
		eventually(t, 2*time.Second, "settlement after the stream", func() bool {
			return metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`)-settledBefore == float64(used)
		})
	}
	refill := int64(time.Since(start).Seconds()*tpm/60) + 1
	if !refused {
		t.Fatal("tpm never refused")
	}
	if usedSum > tpm+refill {
		t.Fatalf("charged %d tokens over a %d-token minute (+%d refill)", usedSum, tpm, refill)
	}
	if int64(admitted)*maxReserve <= tpm+refill {
		t.Fatalf("%d admitted × %d reserved fits the limit anyway: refunds untested", admitted, maxReserve)
	}
	t.Logf("admitted %d, used %d, largest reservation %d", admitted, usedSum, maxReserve)
	settled := metric(t, gws[0].URL, "kvgate_tokens_settled_total", `tenant="alice"`) + metric(t, gws[1].URL, "kvgate_tokens_settled_total", `tenant="alice"`)
	reserved := metric(t, gws[0].URL, "kvgate_tokens_reserved_total", `tenant="alice"`) + metric(t, gws[1].URL, "kvgate_tokens_reserved_total", `tenant="alice"`)
	if int64(settled) != usedSum || reserved <= settled {
		t.Fatalf("settled %v (want the usage %d), reserved %v", settled, usedSum, reserved)
	}
	if n := metric(t, gws[0].URL, "kvgate_ratelimited_total", `limit="tpm"`) + metric(t, gws[1].URL, "kvgate_ratelimited_total", `limit="tpm"`); n != 1 {
		t.Fatalf("kvgate_ratelimited_total{limit=tpm} = %v", n)
	}
	// A request larger than the whole minute's tokens is refused at once, whatever the wait.
	big := fmt.Sprintf(`{"text":"hi","sampling_params":{"max_new_tokens":%d}}`, tpm+1)
	r := post(t, gws[0].URL, "/generate", tenantKey, big)
	checkNeverPasses(t, r)
}

// max_concurrent 3 over two replicas: of 10 slow streams started together, 3 run and 7 get a
// 429; once they end, the slots are free again.
func TestLimitMaxConcurrentAcrossReplicas(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", "50ms")
	gws := twoReplicas(t, limitsYAML(testRedisURL(), uniquePrefix(t), "max_concurrent: 3", "", sim.URL))
	slow := `{"model":"sim","messages":[{"role":"user","content":"take your time"}],"max_tokens":40,"stream":true}`
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r := post(t, gws[i%2].URL, "/v1/chat/completions", tenantKey, slow)
			if r.status == 429 {
				checkRateLimited(t, r, "requests")
			} else if r.status != 200 || !strings.Contains(string(r.body), "[DONE]") {
				t.Errorf("stream: %d %s", r.status, r.body)
			}
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	if codes[200] != 3 || codes[429] != 7 {
		t.Fatalf("max_concurrent 3: %v", codes)
	}
	limited := metric(t, gws[0].URL, "kvgate_ratelimited_total", `limit="max_concurrent"`) + metric(t, gws[1].URL, "kvgate_ratelimited_total", `limit="max_concurrent"`)
	if limited != 7 {
		t.Fatalf("kvgate_ratelimited_total{limit=max_concurrent} = %v", limited)
	}
	// Every stream has ended: three run at once again (settled when each body closed).
	eventually(t, 2*time.Second, "slots freed after the streams", func() bool {
		return post(t, gws[1].URL, "/v1/chat/completions", tenantKey, smallChat).status == 200
	})
}

func admin(t *testing.T, method, url, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer admin-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b []byte
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b = append(b, sc.Bytes()...)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// A tenant created on replica 1 calls replica 2 within a second; its limits change at run time;
// deleted, it gets 401 on both within a second. Keys only ever go in as hashes.
func TestTenantAdminAcrossReplicas(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gws := twoReplicas(t, limitsYAML(testRedisURL(), uniquePrefix(t), "rpm: 0", "", sim.URL))
	const key = "sk-carol-new"
	if r := post(t, gws[1].URL, "/v1/chat/completions", key, smallChat); r.status != 401 {
		t.Fatalf("unknown key: %d", r.status)
	}
	created := fmt.Sprintf(`{"name":"carol","key_sha256":%q,"rpm":100}`, testkit.KeySHA256(key))
	if r := admin(t, "POST", gws[0].URL+"/admin/tenants", created); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	eventually(t, time.Second, "replica 2 serves the new tenant", func() bool {
		return post(t, gws[1].URL, "/v1/chat/completions", key, smallChat).status == 200
	})
	if r := post(t, gws[0].URL, "/v1/chat/completions", key, smallChat); r.status != 200 {
		t.Fatalf("replica 1 serves its own new tenant at once: %d", r.status)
	}

	// Refusals, in the admin envelope.
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/admin/tenants", created, 409, "tenant_exists"},
		{"POST", "/admin/tenants", fmt.Sprintf(`{"name":"alice","key_sha256":%q}`, testkit.KeySHA256("other")), 409, "tenant_exists"},
		{"POST", "/admin/tenants", fmt.Sprintf(`{"name":"dave","key_sha256":%q}`, testkit.KeySHA256(key)), 409, "key_in_use"},
		{"POST", "/admin/tenants", fmt.Sprintf(`{"name":"dave","key_sha256":%q}`, testkit.KeySHA256("sk-bob")), 409, "key_in_use"},
		{"POST", "/admin/tenants", `{"name":"dave","key":"sk-plain"}`, 400, "invalid_request"},
		{"POST", "/admin/tenants", `{"name":"dave","key_sha256":"abc"}`, 400, "invalid_request"},
		{"POST", "/admin/tenants", fmt.Sprintf(`{"name":"da ve","key_sha256":%q}`, testkit.KeySHA256("x")), 400, "invalid_request"},
		{"POST", "/admin/tenants", fmt.Sprintf(`{"name":"dave","key_sha256":%q,"rpm":-1}`, testkit.KeySHA256("x")), 400, "invalid_request"},
		{"POST", "/admin/tenants", fmt.Sprintf(`{"name":"dave","key_sha256":%q,"rps":1}`, testkit.KeySHA256("x")), 400, "invalid_request"},
		{"PATCH", "/admin/tenants/alice", `{"rpm":1}`, 409, "config_tenant"},
		{"DELETE", "/admin/tenants/alice", ``, 409, "config_tenant"},
		{"PATCH", "/admin/tenants/nobody", `{"rpm":1}`, 404, "not_found"},
		{"DELETE", "/admin/tenants/nobody", ``, 404, "not_found"},
		{"PUT", "/admin/tenants/carol", `{}`, 405, "method_not_allowed"},
	} {
		r := admin(t, c.method, gws[0].URL+c.path, c.body)
		if r.status != c.status || decodeError(t, r).Error.Code != c.code {
			t.Errorf("%s %s %s: %d %s", c.method, c.path, c.body, r.status, r.body)
		}
	}
	if r := post(t, gws[0].URL, "/admin/tenants", "sk-bob", created); r.status != 401 {
		t.Fatalf("a tenant key is not an admin key: %d", r.status)
	}

	// PATCH: carol's limit drops to 1 rpm on every replica.
	if r := admin(t, "PATCH", gws[1].URL+"/admin/tenants/carol", `{"rpm":1}`); r.status != 200 {
		t.Fatalf("patch: %d %s", r.status, r.body)
	}
	eventually(t, time.Second, "the new limit on replica 1", func() bool {
		return post(t, gws[0].URL, "/v1/chat/completions", key, smallChat).status == 429
	})

	r := admin(t, "GET", gws[1].URL+"/admin/tenants", "")
	var list struct {
		Tenants []map[string]any `json:"tenants"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || r.status != 200 || len(list.Tenants) != 3 {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	if c := list.Tenants[2]; c["name"] != "carol" || c["source"] != "runtime" || c["rpm"] != float64(1) || c["key_sha256_prefix"] != testkit.KeySHA256(key)[:8] {
		t.Fatalf("carol listed as %v", c)
	}
	if strings.Contains(string(r.body), testkit.KeySHA256(key)) {
		t.Fatal("the list shows a prefix of the key hash, not the hash")
	}

	if r := admin(t, "DELETE", gws[1].URL+"/admin/tenants/carol", ""); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	eventually(t, time.Second, "401 on both replicas after the delete", func() bool {
		return post(t, gws[0].URL, "/v1/chat/completions", key, smallChat).status == 401 &&
			post(t, gws[1].URL, "/v1/chat/completions", key, smallChat).status == 401
	})
}

// Redis stops mid-test: each replica enforces its share (limit / limits.replicas), says so in
// /readyz and a metric, and no request hangs; Redis back, the limit is shared again and what was
// admitted during the outage still counts (no fresh burst).
func TestLimitsRedisOutage(t *testing.T) {
	port := procs.FreePort(t)
	stop := startRedis(t, port)
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	gws := twoReplicas(t, limitsYAML(url, "outage:", "rpm: 20", "limits: {replicas: 2, redis_timeout: 50ms}\n", sim.URL))
	client := &http.Client{Timeout: 3 * time.Second} // a hung request fails the test
	fire := func(gw *testkit.Gateway, n int) map[int]int {
		codes := map[int]int{}
		for i := 0; i < n; i++ {
			req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(smallChat))
			req.Header.Set("Authorization", "Bearer "+tenantKey)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("request %d while Redis is stopped or back: %v", i, err)
			}
			resp.Body.Close()
			codes[resp.StatusCode]++
		}
		return codes
	}
	start := time.Now()
	if c := fire(gws[0], 4); c[200] != 4 {
		t.Fatalf("shared, before the outage: %v", c)
	}
	stop()
	// Share 10 each. Replica 1 last saw the shared cell 20 % full (4 of 20) and starts its share
	// that full: 8 left. Replica 2 never served alice, so it starts empty: 10.
	c0 := fire(gws[0], 15)
	c1 := fire(gws[1], 15)
	if c0[200] != 8 || c1[200] != 10 || c0[429] != 7 || c1[429] != 5 {
		t.Fatalf("local shares of rpm 20 over 2 replicas: replica 1 %v, replica 2 %v", c0, c1)
	}
	for _, gw := range gws {
		r := get(t, gw.URL+"/readyz", "")
		if r.status != 200 || !strings.Contains(string(r.body), `"limits":{"mode":"local_share","replicas":2}`) {
			t.Fatalf("readyz while Redis is down: %d %s", r.status, r.body)
		}
		if metric(t, gw.URL, "kvgate_limits_degraded") != 1 || metric(t, gw.URL, "kvgate_limits_replicas") != 2 {
			t.Fatal("kvgate_limits_degraded / kvgate_limits_replicas")
		}
	}

	startRedis(t, port) // an empty Redis: what the replicas admitted alone is carried into it
	for _, gw := range gws {
		eventually(t, 5*time.Second, "limits shared again", func() bool {
			return metric(t, gw.URL, "kvgate_limits_degraded") == 0
		})
	}
	// Carried: replica 1's 8 and replica 2's 10 = 18 of 20 (the pre-outage 4 died with the old
	// Redis). At most 2 more (plus refill), across both replicas: not a fresh 20, nor 10 each.
	after := fire(gws[0], 10)
	after2 := fire(gws[1], 10)
	refill := int(time.Since(start)/(3*time.Second)) + 1
	if n := after[200] + after2[200]; n > 2+refill || after[429]+after2[429] < 20-2-refill {
		t.Fatalf("after recovery %d admitted (replica 1 %v, replica 2 %v); want at most 2 + %d refill", n, after, after2, refill)
	}
	if !strings.Contains(string(get(t, gws[0].URL+"/readyz", "").body), `"status":"ready"`) {
		t.Fatal("readyz after recovery")
	}
}

// A PD request whose legs are retried is admitted and charged once, and a reply that failed
// releases its token reservation.
func TestLimitPDRetryChargedOnce(t *testing.T) {
	decode := procs.StartSim(t, "--mode", "decode", "--pool-tokens", "16384", "--context-length", "16384", "--page-size", "16", "--transfer-timeout", "20s")
	purl, calls := brokenPrefill(t)
	hash := testkit.KeySHA256(tenantKey)
	yaml := strings.Replace(gatewayYAML(fmt.Sprintf("state: {redis_url: %q, key_prefix: %q}\n", testRedisURL(), uniquePrefix(t)),
		[3]string{"p", purl, "prefill"}, [3]string{"d", decode.URL, "decode"}),
		fmt.Sprintf("key_sha256: %q}", hash), fmt.Sprintf("key_sha256: %q, rpm: 2, tpm: 1000}", hash), 1)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	body := `{"text":"hello there","sampling_params":{"max_new_tokens":4}}`
	for i := 0; i < 2; i++ {
		if r := post(t, gw.URL, "/generate", tenantKey, body); r.status != 500 {
			t.Fatalf("request %d: want the prefill's 500, got %d %s", i, r.status, r.body)
		}
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("want two tries per request (4 prefill calls), got %d", n)
	}
	// rpm 2: two requests of two tries each were charged as two requests.
	checkRateLimited(t, post(t, gw.URL, "/generate", tenantKey, body), "requests")
	if s, r := metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`), metric(t, gw.URL, "kvgate_tokens_reserved_total", `tenant="alice"`); s != 0 || r == 0 {
		t.Fatalf("failed replies must release their reservation: settled %v of %v reserved", s, r)
	}
}

// A stream the client leaves early is settled with what was produced up to then (the events
// that carried text, a token each), not with its whole reservation; a chat stream whose client
// did not ask for usage is settled by the usage the gateway asked the engine for.
func TestLimitCutStreamSettlesWhatWasProduced(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", "40ms")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML(testRedisURL(), uniquePrefix(t), "tpm: 100000", "", sim.URL)))
	settled := func() float64 { return metric(t, gw.URL, "kvgate_tokens_settled_total", `tenant="alice"`) }

	req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"go on and on","sampling_params":{"max_new_tokens":200},"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", err, resp)
	}
	reserved, _ := strconv.ParseInt(resp.Header.Get("X-Kvgate-Tokens"), 10, 64)
	reserved += 200
	sc := bufio.NewScanner(resp.Body)
	for n := 0; n < 3 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			n++
		}
	}
	resp.Body.Close() // the client goes away after 3 events
	eventually(t, 5*time.Second, "the cut stream is settled", func() bool { return settled() > 0 })
	if s := settled(); s >= float64(reserved) || s < 3 {
		t.Fatalf("a stream cut after 3 events settled %v tokens (reserved %d)", s, reserved)
	}

	before := settled()
	r := post(t, gw.URL, "/v1/chat/completions", tenantKey, `{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`)
	if r.status != 200 {
		t.Fatalf("chat stream: %d %s", r.status, r.body)
	}
	// The client did not ask for usage: the gateway asked the engine, so the prompt is charged
	// as the engine counted it (bob, without limits, gets the same prompt's count), not our bound.
	prompt := int(largest(promptCountRE, post(t, gw.URL, "/v1/chat/completions", "sk-bob",
		`{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`).body))
	if bound, _ := strconv.Atoi(r.header.Get("X-Kvgate-Tokens")); prompt <= 0 || prompt >= bound {
		t.Fatalf("the engine's prompt count %d, our bound %d", prompt, bound)
	}
	if strings.Contains(string(r.body), "usage") {
		t.Fatalf("usage the client did not ask for reached it: %s", r.body)
	}
	events, text := len(dataLines(r.body))-1, 0 // without [DONE]
	for _, d := range dataLines(r.body) {
		if strings.Contains(d, `"content":"`) && !strings.Contains(d, `"content":""`) {
			text++
		}
	}
	if text != 5 || events != 7 {
		t.Fatalf("a 5-token chat stream: %d events, %d with text: %s", events, text, r.body)
	}
	// Charged the 5 tokens it generated: the role chunk and the finish chunk carry none.
	eventually(t, 2*time.Second, "the chat stream is settled", func() bool {
		return settled()-before == float64(prompt+text)
	})
}

// Without Redis (one replica) tenants and limits live in memory, with the same API.
func TestTenantAdminInMemory(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML("", "", "rpm: 0", "", sim.URL)))
	if r := admin(t, "POST", gw.URL+"/admin/tenants", fmt.Sprintf(`{"name":"erin","key_sha256":%q,"rpm":1}`, testkit.KeySHA256("sk-erin"))); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-erin", smallChat); r.status != 200 {
		t.Fatalf("new tenant: %d %s", r.status, r.body)
	}
	checkRateLimited(t, post(t, gw.URL, "/v1/chat/completions", "sk-erin", smallChat), "requests")
	if r := admin(t, "DELETE", gw.URL+"/admin/tenants/erin", ""); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-erin", smallChat); r.status != 401 {
		t.Fatalf("deleted tenant: %d", r.status)
	}
}

// Redis stopped, max_concurrent: 1 over 2 replicas (a limit smaller than the replica count):
// neither replica locks the tenant out while nothing is in flight (each grants 1, the documented
// choice), and a second request in flight on one replica gets a 429 that says the limits are
// degraded and why, not a bare "too many in flight".
func TestDegradedSmallLimitNotLockedOut(t *testing.T) {
	port := procs.FreePort(t)
	stop := startRedis(t, port)
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "50ms")
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	gws := twoReplicas(t, limitsYAML(url, uniquePrefix(t), "max_concurrent: 1", "limits: {replicas: 2, redis_timeout: 50ms}\n", sim.URL))
	stop()
	for i, gw := range gws {
		// The first call after the stop finds Redis gone and decides locally: both must pass.
		for j := 0; j < 2; j++ {
			if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 200 {
				t.Fatalf("replica %d, request %d with nothing in flight while Redis is down: %d %s", i+1, j+1, r.status, r.body)
			}
		}
		if metric(t, gw.URL, "kvgate_limits_degraded") != 1 {
			t.Fatalf("replica %d is not degraded", i+1)
		}
	}
	// One stream in flight on replica 1 (40 tokens at 50 ms: 2 s): a second request there is 429.
	req, _ := http.NewRequest("POST", gws[0].URL+"/generate", strings.NewReader(`{"text":"a long one","sampling_params":{"max_new_tokens":40},"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the stream: %v %v", err, resp)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // its first event: in flight
		t.Fatal(err)
	}
	second := post(t, gws[0].URL, "/v1/chat/completions", tenantKey, smallChat)
	if second.status != 429 {
		t.Fatalf("a second request while one is in flight on the same replica: %d %s", second.status, second.body)
	}
	msg := decodeError(t, second).Error.Message
	if !strings.Contains(msg, "limit 1 concurrent") || !strings.Contains(msg, "Limits are degraded") || !strings.Contains(msg, "each of 2 replicas enforces its own share, 1") {
		t.Fatalf("the 429 while degraded does not say why: %q", msg)
	}
}
