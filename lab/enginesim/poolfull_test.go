package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The load endpoint reports the tokens in use, and a request that finds the pool without room
// is counted in /sim/stats pool_full_hits (it waits for the first to finish, then runs).
func TestPoolFullHitsAndUsedTokens(t *testing.T) {
	s := startInProcess(t, Config{ContextLength: 4096, PageSize: 16, PoolTokens: 256, Tokenizer: "chunk4", TokenDelay: 20 * time.Millisecond})
	base := "http://" + s.Addr()
	gen := func(done chan<- int) {
		body := `{"text":"` + strings.Repeat("abcd", 100) + `","sampling_params":{"max_new_tokens":100}}`
		resp, err := http.Post(base+"/generate", "application/json", strings.NewReader(body))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}
	used := func() int {
		resp, err := http.Get(base + "/v1/loads")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct {
			Loads []struct {
				Used int `json:"num_used_tokens"`
			} `json:"loads"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || len(l.Loads) != 1 {
			t.Fatalf("loads: %v %+v", err, l)
		}
		return l.Loads[0].Used
	}
	first, second := make(chan int, 1), make(chan int, 1)
	go gen(first)
	for deadline := time.Now().Add(10 * time.Second); used() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first request never showed as tokens in use")
		}
	}
	if st := s.Stats(); st.PoolFullHits != 0 {
		t.Fatalf("pool_full_hits %d with one request in a pool that holds it", st.PoolFullHits)
	}
	go gen(second) // 200 tokens each: two cannot share 256 (the first holds its pages for ~2s of tokens)
	if a, b := <-first, <-second; a != 200 || b != 200 {
		t.Fatalf("statuses %d %d", a, b)
	}
	if st := s.Stats(); st.PoolFullHits != 1 {
		t.Fatalf("pool_full_hits %d, want 1 (the second found the pool full)", st.PoolFullHits)
	}
	if n := used(); n != 0 {
		t.Fatalf("%d tokens in use after both finished", n)
	}
}
