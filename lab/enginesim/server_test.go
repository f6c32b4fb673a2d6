package enginesim

import (
	"testing"
	"time"
)

func TestCloseRacingServe(t *testing.T) {
	for i := 0; i < 20; i++ {
		s, err := New(Config{Mode: ModePrefill, PoolTokens: 1024, PageSize: 16, ContextLength: 4096, BootstrapPort: 0, Tokenizer: "chunk4"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Listen("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve() }()
		if i%2 == 0 {
			time.Sleep(time.Millisecond)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Serve after Close returned %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Serve did not return after Close")
		}
	}
}
