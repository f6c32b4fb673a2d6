package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// memResult is the gateway's resident memory holding n slow streams.
type memResult struct {
	Streams     int     `json:"streams"`      // streams asked for
	Established int     `json:"established"`  // streams whose first event arrived
	RSSIdleMiB  float64 `json:"rss_idle_mib"` // before the streams
	RSSMiB      float64 `json:"rss_mib"`      // with them all open
	PeakMiB     float64 `json:"peak_mib"`     // VmHWM at that point
	PerStreamKB float64 `json:"per_stream_kib"`
	RampSeconds float64 `json:"ramp_seconds"`
}

// slowStreams opens n streams to a kvgate serve process (pid) at addr, each a raw TCP connection
// that writes its request, reads up to the first event and then reads a little once a second,
// and reads the gateway's RSS once they are all open. Everything closes before it returns.
func slowStreams(ctx context.Context, addr string, pid, n int, limit time.Duration) (memResult, error) {
	res := memResult{Streams: n}
	rss, _, err := vmRSS(pid)
	if err != nil {
		return res, err
	}
	res.RSSIdleMiB = mib(rss)
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		chatPath, addr, benchKey, len(streamBody), streamBody)
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var (
		mu      sync.Mutex
		conns   []net.Conn
		est     atomic.Int64
		failed  atomic.Int64
		lastErr atomic.Value
		wg      sync.WaitGroup
	)
	closeAll := func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
	}
	defer func() { closeAll(); wg.Wait() }()
	start := time.Now()
	sem := make(chan struct{}, 128) // bounded dialing
	for i := 0; i < n && ctx.Err() == nil; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				<-sem
				failed.Add(1)
				lastErr.Store(err.Error())
				return
			}
			mu.Lock()
			if conns == nil && ctx.Err() != nil {
				mu.Unlock()
				c.Close()
				<-sem
				return
			}
			conns = append(conns, c)
			mu.Unlock()
			ok := firstEvent(c, req)
			<-sem
			if !ok {
				failed.Add(1)
				return
			}
			est.Add(1)
			// Read slowly: a few bytes a second, so the gateway holds the stream and its buffers.
			buf := make([]byte, 64)
			for ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
				if _, err := c.Read(buf); err != nil && !isTimeout(err) {
					return
				}
			}
		}()
	}
	for ctx.Err() == nil && est.Load()+failed.Load() < int64(n) {
		time.Sleep(20 * time.Millisecond)
	}
	res.RampSeconds = time.Since(start).Seconds()
	res.Established = int(est.Load())
	time.Sleep(500 * time.Millisecond) // let the gateway settle before reading its memory
	rss, hwm, err := vmRSS(pid)
	if err != nil {
		return res, err
	}
	res.RSSMiB, res.PeakMiB = mib(rss), mib(hwm)
	if res.Established > 0 {
		res.PerStreamKB = round1((res.RSSMiB - res.RSSIdleMiB) * 1024 / float64(res.Established))
	}
	res.RSSIdleMiB, res.RSSMiB, res.PeakMiB = round1(res.RSSIdleMiB), round1(res.RSSMiB), round1(res.PeakMiB)
	res.RampSeconds = round3(res.RampSeconds)
	cancel()
	if res.Established < n {
		e, _ := lastErr.Load().(string)
		return res, fmt.Errorf("%d of %d streams established (%d failed; last error: %s)", res.Established, n, failed.Load(), e)
	}
	return res, nil
}

// firstEvent writes the request and reads until the first event's data line.
func firstEvent(c net.Conn, req string) bool {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(req)); err != nil {
		return false
	}
	br := bufio.NewReaderSize(c, 512)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		return false
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return false
		}
		if strings.Contains(line, "data: ") {
			return true
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
