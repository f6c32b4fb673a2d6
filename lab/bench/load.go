package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// The load generator: fasthttp's client, a fixed number of connections, small chat requests on
// loopback. Three shapes: closed loop (each connection sends its next request when the last
// answered: throughput), fixed rate (latency at a given load), and streams (first-event time
// and per-event delivery latency, from the send time each fast-mode event carries).

const (
	chatPath = "/v1/chat/completions"
	benchKey = "sk-bench"
	// scrapeKey reads the gateway's /metrics (it needs a key by default).
	scrapeKey = "bench-scrape-key"
)

var (
	chatBody   = []byte(`{"model":"sim","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8}`)
	streamBody = []byte(`{"model":"sim","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8,"stream":true}`)
)

// sample is one round against one target.
type sample struct {
	ok, errs int
	elapsed  time.Duration
	lat      []time.Duration // per request (sorted by finish)
}

func (s sample) rps() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ok) / s.elapsed.Seconds()
}

// pct is the q-quantile (0..1) of d, nearest rank; d is sorted in place.
func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(q*float64(len(d))+0.5) - 1
	return d[max(0, min(i, len(d)-1))]
}

func newRequest(addr string, body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + addr + chatPath)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("Authorization", "Bearer "+benchKey)
	req.SetBodyRaw(body)
	return req
}

func newClient(addr string, conns int, stream bool) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: addr, MaxConns: conns, StreamResponseBody: stream,
		ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Second, MaxConnWaitTimeout: 10 * time.Second,
		MaxIdemponentCallAttempts: 1}
}

// closedLoop runs conns connections flat out for dur.
func closedLoop(ctx context.Context, addr string, conns int, dur time.Duration) sample {
	c := newClient(addr, conns, false)
	defer c.CloseIdleConnections()
	start := time.Now()
	deadline := start.Add(dur)
	var mu sync.Mutex
	var all sample
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := newRequest(addr, chatBody), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			lat := make([]time.Duration, 0, 4096)
			errs := 0
			for ctx.Err() == nil {
				t := time.Now()
				if t.After(deadline) {
					break
				}
				err := c.Do(req, resp)
				if err != nil || resp.StatusCode() != 200 {
					errs++
					time.Sleep(time.Millisecond) // a failing target must not turn this into a spin
					continue
				}
				lat = append(lat, time.Since(t))
			}
			all.merge(&mu, lat, errs)
		}()
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}

// merge adds one worker's latencies and errors to s, under mu.
func (s *sample) merge(mu *sync.Mutex, lat []time.Duration, errs int) {
	mu.Lock()
	defer mu.Unlock()
	s.lat = append(s.lat, lat...)
	s.ok += len(lat)
	s.errs += errs
}

// fixedRate sends rate requests per second for dur from conns workers; latency is measured
// from each request's send.
func fixedRate(ctx context.Context, addr string, rate, conns int, dur time.Duration) sample {
	c := newClient(addr, conns, false)
	defer c.CloseIdleConnections()
	n := int64(float64(rate) * dur.Seconds())
	interval := time.Second / time.Duration(rate)
	start := time.Now().Add(5 * time.Millisecond)
	var next atomic.Int64
	var mu sync.Mutex
	var all sample
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := newRequest(addr, chatBody), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			var lat []time.Duration
			errs := 0
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= n {
					break
				}
				time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
				t := time.Now()
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
					errs++
					continue
				}
				lat = append(lat, time.Since(t))
			}
			all.merge(&mu, lat, errs)
		}()
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}

// streamSample is one round of streams against one target.
type streamSample struct {
	streams, errs int
	firstEvent    []time.Duration // request sent → first event read
	eventLat      []time.Duration // event written by the simulator → read by the client
	events        int
}

// streams runs conns connections of back-to-back streamed chat requests for dur.
func streams(ctx context.Context, addr string, conns int, dur time.Duration) streamSample {
	deadline := time.Now().Add(dur)
	return streamLoop(ctx, addr, conns, func() bool { return time.Now().Before(deadline) })
}

// streamLoop reads streamed chat replies on workers connections, each worker starting another
// while more says so: one loop for the timed and the counted runs.
func streamLoop(ctx context.Context, addr string, workers int, more func() bool) streamSample {
	c := newClient(addr, workers, true)
	defer c.CloseIdleConnections()
	var mu sync.Mutex
	var all streamSample
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s streamSample
			req := newRequest(addr, streamBody)
			defer fasthttp.ReleaseRequest(req)
			br := bufio.NewReaderSize(nil, 16<<10)
			for ctx.Err() == nil && more() {
				if streamOnce(c, req, br, &s) {
					s.streams++
				} else {
					s.errs++
					time.Sleep(time.Millisecond)
				}
			}
			mu.Lock()
			all.streams += s.streams
			all.errs += s.errs
			all.events += s.events
			all.firstEvent = append(all.firstEvent, s.firstEvent...)
			all.eventLat = append(all.eventLat, s.eventLat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

func streamOnce(c *fasthttp.HostClient, req *fasthttp.Request, br *bufio.Reader, s *streamSample) bool {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	t0 := time.Now()
	if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 || resp.BodyStream() == nil {
		return false
	}
	defer resp.CloseBodyStream()
	br.Reset(resp.BodyStream())
	first, done := true, false
	var lat []time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			break
		}
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		now := time.Now()
		if first {
			s.firstEvent = append(s.firstEvent, now.Sub(t0))
			first = false
		}
		if bytes.HasPrefix(data, []byte("[DONE]")) {
			done = true
			break
		}
		if ts, ok := stamp(data); ok {
			lat = append(lat, time.Duration(now.UnixNano()-ts))
		}
	}
	if !done {
		return false
	}
	// Read the stream to its end so the connection is reused: a new connection per stream would
	// put a TCP handshake into every first-event time.
	_, _ = io.Copy(io.Discard, br)
	s.eventLat = append(s.eventLat, lat...)
	s.events += len(lat)
	return true
}

// stamp finds the send time a fast-mode content event carries: `"t<unix ns>`.
func stamp(data []byte) (int64, bool) {
	for off := 0; ; {
		i := bytes.Index(data[off:], []byte(`"t`))
		if i < 0 {
			return 0, false
		}
		j := off + i + 2
		k := j
		for k < len(data) && data[k] >= '0' && data[k] <= '9' {
			k++
		}
		if k-j >= 18 {
			n, err := strconv.ParseInt(string(data[j:k]), 10, 64)
			return n, err == nil
		}
		off = j
	}
}
