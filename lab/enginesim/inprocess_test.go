package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

func startInProcess(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Concurrent PD traffic (normal, oversized, streamed, aborted) through
// in-process servers: run with -race to check the pool, the rooms and the
// stream writers; every page must be back in the free list at the end.
func TestInProcessPDConcurrency(t *testing.T) {
	common := Config{ContextLength: 4096, PageSize: 16, Tokenizer: "chunk4", Bug: kvmodel.BugAdmitRejected}
	pc, dc := common, common
	pc.Mode, pc.PoolTokens, pc.BootstrapPort = ModePrefill, 512, 0
	// Rooms of aborted decodes are never pulled; they expire quickly here.
	pc.RoomTTL = 300 * time.Millisecond
	dc.Mode, dc.PoolTokens = ModeDecode, 8192
	pre, dec := startInProcess(t, pc), startInProcess(t, dc)
	port := pre.BootstrapPort()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				room := w*1000 + i
				words := 20 + (i*37+w*11)%80
				if i%5 == 4 {
					words = 900 // over prefill's max_req_input_len (506)
				}
				body, _ := json.Marshal(map[string]any{"text": strings.Repeat(fmt.Sprintf("w%d ", w), words),
					"rid": fmt.Sprintf("r%d-%d", w, i), "stream": i%3 == 0, "sampling_params": map[string]any{"max_new_tokens": 32},
					"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room})
				var inner sync.WaitGroup
				inner.Add(1)
				go func() {
					defer inner.Done()
					if r, err := http.Post("http://"+pre.Addr()+"/generate", "application/json", bytes.NewReader(body)); err == nil {
						io.Copy(io.Discard, r.Body)
						r.Body.Close()
					}
				}()
				if i%7 == 6 {
					go http.Post("http://"+dec.Addr()+"/abort_request", "application/json",
						strings.NewReader(fmt.Sprintf(`{"rid":"r%d-%d"}`, w, i)))
				}
				r, err := http.Post("http://"+dec.Addr()+"/generate", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					inner.Wait()
					return
				}
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				inner.Wait()
				mu.Lock()
				statuses[r.StatusCode]++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if statuses[200] == 0 || len(statuses) > 1 {
		t.Errorf("statuses %v, want all 200 (the bug admits the oversized ones)", statuses)
	}
	for name, s := range map[string]*Server{"prefill": pre, "decode": dec} {
		st := s.Stats()
		for deadline := time.Now().Add(2 * time.Second); st.Pool.PagesFree != st.Pool.PagesTotal && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			st = s.Stats()
		}
		if st.Pool.PagesFree != st.Pool.PagesTotal {
			t.Errorf("%s: %d of %d pages free after all requests", name, st.Pool.PagesFree, st.Pool.PagesTotal)
		}
	}
	if got := dec.Stats().Requests["/generate"]; got != 60 {
		t.Errorf("decode counted %d requests, want 60", got)
	}
}
