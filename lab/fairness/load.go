package fairness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim"
)

// result is what one run measured.
type result struct {
	mu       sync.Mutex
	ttfts    map[string][]float64 // light tenant → TTFTs (ms) of requests started in the window
	refused  map[string]map[int]int
	requests map[string]int
	// unanswered: light requests without a first token when the window closed
	unanswered map[string]int
	tokens     map[string]int64 // tenant → prompt + completion tokens of replies that ended in the window
	kv         []float64
	poolFull   int
	window     time.Duration
}

func (r *result) totalRate() float64 {
	var n int64
	for _, t := range r.tokens {
		n += t
	}
	return float64(n) / r.window.Seconds()
}

func (r *result) rate(tenants ...string) float64 {
	var n int64
	for _, t := range tenants {
		n += r.tokens[t]
	}
	return float64(n) / r.window.Seconds()
}

// row turns a run into the report's row.
func (r *result) row(p Params, setup string, n int, solo map[string][]float64, noneRate float64) Row {
	row := Row{Setup: setup, Replicas: n, PoolFullHits: r.poolFull, WeightShare: map[string]float64{}}
	var kv float64
	for _, x := range r.kv {
		kv += x
	}
	if len(r.kv) > 0 {
		row.KVUse = round(kv/float64(len(r.kv)), 3)
	}
	var lights []string
	for i := 0; i < p.LightTenants; i++ {
		t := lightName(i)
		lights = append(lights, t)
		l := Light{Tenant: t, Requests: r.requests[t], Unanswered: r.unanswered[t],
			TTFTP50: round(percentile(r.ttfts[t], .5), 1), TTFTP99: round(percentile(r.ttfts[t], .99), 1),
			SoloTTFTP50: round(percentile(solo[t], .5), 1), SoloTTFTP99: round(percentile(solo[t], .99), 1)}
		for code, c := range r.refused[t] {
			l.Refused += c
			if l.RefusedCodes == nil {
				l.RefusedCodes = map[string]int{}
			}
			l.RefusedCodes[strconv.Itoa(code)] = c
		}
		row.Lights = append(row.Lights, l)
	}
	heavyRate := r.rate(heavy4, heavy1)
	if left := noneRate - r.rate(lights...); left > 0 {
		row.Heavy.LeftoverShare = round(heavyRate/left, 3)
	}
	row.Heavy.TokensPerS = round(heavyRate, 0)
	for _, t := range []string{heavy4, heavy1} {
		for _, c := range r.refused[t] {
			row.Heavy.Refused += c
		}
	}
	if heavyRate > 0 {
		row.WeightShare["4"] = round(r.rate(heavy4)/heavyRate, 3)
		row.WeightShare["1"] = round(r.rate(heavy1)/heavyRate, 3)
	}
	row.Jain = round(jain([]float64{float64(r.tokens[heavy4]) / 4, float64(r.tokens[heavy1])}), 3)
	row.TotalTokensPerS = round(r.totalRate(), 0)
	return row
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}}

// runLoad runs the light tenants for dur (after p.Warm of heavy load alone when heavy) and, with
// heavy, both heavy tenants from the start: heavy-w4 into bases[0] only, heavy-w1 into the
// other replicas (bases[0] when there is one); light tenants rotate over all replicas.
func runLoad(ctx context.Context, p Params, bases []string, sim *enginesim.Server, heavy bool, dur time.Duration) *result {
	r := &result{ttfts: map[string][]float64{}, refused: map[string]map[int]int{}, requests: map[string]int{}, unanswered: map[string]int{}, tokens: map[string]int64{}, window: dur}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hitsBefore := sim.Stats().PoolFullHits
	var wg sync.WaitGroup
	var winStart, winEnd time.Time
	inWindow := func(t time.Time) bool { return !winStart.IsZero() && !t.Before(winStart) && t.Before(winEnd) }
	var winMu sync.Mutex
	window := func(t time.Time) bool { winMu.Lock(); defer winMu.Unlock(); return inWindow(t) }
	if heavy {
		prompt := strings.Repeat("hello ", p.HeavyPrompt)
		for ti, tenant := range []string{heavy4, heavy1} {
			for i := 0; i < p.HeavyStreams; i++ {
				base := bases[0]
				if tenant == heavy1 && len(bases) > 1 {
					base = bases[1+i%(len(bases)-1)]
				}
				// Streams start spread over the first half of the warm-up and ask for 50–150% of
				// heavy_max_tokens: in lockstep they would finish in waves that the window counts
				// in whole waves.
				rng := rand.New(rand.NewPCG(uint64(ti), uint64(i)))
				delay := time.Duration(int64(p.Warm) / 2 * int64(i) / int64(p.HeavyStreams))
				wg.Add(1)
				go func() {
					defer wg.Done()
					sleepCtx(ctx, delay)
					for ctx.Err() == nil {
						body, _ := json.Marshal(map[string]any{"model": "sim", "prompt": prompt,
							"max_tokens": p.HeavyMaxTokens/2 + rng.IntN(p.HeavyMaxTokens+1)})
						code, tokens, err := complete(ctx, base, tenant, body)
						now := time.Now()
						switch {
						case err != nil:
						case code != 200:
							if window(now) {
								r.count(tenant, code, 0)
							}
							sleepCtx(ctx, 50*time.Millisecond) // no tight loop on refusals
						case window(now):
							r.count(tenant, 200, tokens)
						}
					}
				}()
			}
		}
		sleepCtx(ctx, p.Warm)
	}
	winMu.Lock()
	winStart, winEnd = time.Now(), time.Now().Add(dur)
	winMu.Unlock()
	lightBody, _ := json.Marshal(map[string]any{"model": "sim", "prompt": strings.Repeat("hi ", p.LightPrompt), "max_tokens": p.LightMaxTokens,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	lctx, lcancel := context.WithDeadline(ctx, winEnd)
	defer lcancel()
	var lwg sync.WaitGroup
	for i := 0; i < p.LightTenants; i++ {
		tenant := lightName(i)
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for k := i; lctx.Err() == nil; k++ {
				start := time.Now()
				code, ttft, tokens, err := stream(lctx, bases[k%len(bases)], tenant, lightBody)
				switch {
				case err != nil && lctx.Err() != nil && ttft == 0:
					// The window closed before its first token (still queued, or starved): its wait
					// so far is a lower bound of its TTFT, and it is counted as unanswered.
					r.mu.Lock()
					r.unanswered[tenant]++
					r.ttfts[tenant] = append(r.ttfts[tenant], float64(time.Since(start))/float64(time.Millisecond))
					r.mu.Unlock()
				case err != nil && lctx.Err() != nil: // the window closed mid-reply: not counted
				case err != nil:
					r.count(tenant, 599, 0)
				case code != 200:
					r.count(tenant, code, 0)
				default:
					r.count(tenant, 200, tokens)
					r.mu.Lock()
					r.ttfts[tenant] = append(r.ttfts[tenant], float64(ttft)/float64(time.Millisecond))
					r.mu.Unlock()
				}
				sleepCtx(lctx, p.LightThink)
			}
		}()
	}
	// The engine's KV use, sampled through the window.
	for time.Now().Before(winEnd) && ctx.Err() == nil {
		st := sim.Stats()
		if heavy {
			r.kv = append(r.kv, 1-float64(st.Pool.PagesFree)/float64(st.Pool.PagesTotal))
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	lwg.Wait()
	r.poolFull = sim.Stats().PoolFullHits - hitsBefore
	cancel()
	wg.Wait()
	return r
}

func (r *result) count(tenant string, code int, tokens int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if code == 200 {
		r.requests[tenant]++
		r.tokens[tenant] += tokens
		return
	}
	if r.refused[tenant] == nil {
		r.refused[tenant] = map[int]int{}
	}
	r.refused[tenant][code]++
}

type usage struct {
	Usage *struct {
		Prompt     int64 `json:"prompt_tokens"`
		Completion int64 `json:"completion_tokens"`
	} `json:"usage"`
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
}

func post(ctx context.Context, base, tenant string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tenantKey(tenant))
	req.Header.Set("Content-Type", "application/json")
	return client.Do(req)
}

// complete sends one non-streamed completion; tokens are the reply's usage.
func complete(ctx context.Context, base, tenant string, body []byte) (code int, tokens int64, err error) {
	resp, err := post(ctx, base, tenant, body)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		return resp.StatusCode, 0, err
	}
	var u usage
	if json.Unmarshal(b, &u) != nil || u.Usage == nil {
		return resp.StatusCode, 0, errors.New("no usage in the reply")
	}
	return 200, u.Usage.Prompt + u.Usage.Completion, nil
}

// stream sends one streamed completion: the time to its first text, and its usage.
func stream(ctx context.Context, base, tenant string, body []byte) (code int, ttft time.Duration, tokens int64, err error) {
	start := time.Now()
	resp, err := post(ctx, base, tenant, body)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, 0, 0, nil
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var u usage
		if json.Unmarshal([]byte(data), &u) != nil {
			continue
		}
		if ttft == 0 && len(u.Choices) > 0 && u.Choices[0].Text != "" {
			ttft = time.Since(start)
		}
		if u.Usage != nil {
			tokens = u.Usage.Prompt + u.Usage.Completion
		}
	}
	if err := sc.Err(); err != nil {
		return 200, ttft, 0, err
	}
	if ttft == 0 {
		return 200, 0, 0, errors.New("a stream without text")
	}
	return 200, ttft, tokens, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
