package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Redis stopped and restarted while streams are in flight (the sequential cases are in
// limits_test.go and outage_test.go): every request is answered, none hangs, none is a 5xx, and
// streams admitted before the stop run to their end.
func TestFaultRedisStopUnderLoad(t *testing.T) {
	port := procs.FreePort(t)
	stop := startRedis(t, port)
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192", "--token-delay", "20ms")
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, limitsYAML(url, uniquePrefix(t), "rpm: 100000, tpm: 100000000, max_concurrent: 64",
		"limits: {redis_timeout: 50ms}\n", sim.URL)))
	begin := time.Now()
	done := make(chan struct{})
	var answered, failed *atomic.Int64
	var errs *sync.Map
	go func() {
		defer close(done)
		answered, failed, errs = redisLoad(t, gw, begin.Add(5*time.Second))
	}()
	time.Sleep(time.Second)
	stop()
	stoppedAt := time.Since(begin)
	eventually(t, 2*time.Second, "degraded while Redis is stopped", func() bool {
		return metric(t, gw.URL, "kvgate_limits_degraded") == 1
	})
	time.Sleep(1500 * time.Millisecond) // streams keep starting and ending while Redis is gone
	startRedis(t, port)
	restartedAt := time.Since(begin)
	<-done
	errs.Range(func(k, _ any) bool { t.Errorf("during the outage: %v", k); return true })
	if failed.Load() != 0 || answered.Load() < 20 {
		t.Fatalf("%d answered, %d failed (Redis stopped at %s, back at %s)", answered.Load(), failed.Load(), stoppedAt, restartedAt)
	}
	eventually(t, 5*time.Second, "limits shared again", func() bool { return metric(t, gw.URL, "kvgate_limits_degraded") == 0 })
	t.Logf("%d streams answered, none failed; Redis stopped at %s, back at %s", answered.Load(), stoppedAt.Round(time.Millisecond), restartedAt.Round(time.Millisecond))
}

func redisLoad(t *testing.T, gw *testkit.Gateway, stopAt time.Time) (answered, failed *atomic.Int64, errs *sync.Map) {
	answered, failed, errs = &atomic.Int64{}, &atomic.Int64{}, &sync.Map{}
	client := &http.Client{Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stopAt) {
				req, _ := http.NewRequest("POST", gw.URL+"/generate", strings.NewReader(`{"text":"load","sampling_params":{"max_new_tokens":10},"stream":true}`))
				req.Header.Set("Authorization", "Bearer "+tenantKey)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					errs.Store(err.Error(), true)
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode >= 500 || resp.StatusCode == 200 && !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
					failed.Add(1)
					errs.Store(fmt.Sprintf("%d %v %.200s", resp.StatusCode, err, b), true)
					continue
				}
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	return
}
