// Package redistest gives tests the shared test Redis: KVGATE_TEST_REDIS (default db 15 on
// 127.0.0.1:6379) with a key prefix unique to the test, whose keys are deleted at the end (never
// FLUSHDB: packages run in parallel against one server).
package redistest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/state"
)

// URL is the test Redis.
func URL() string {
	if u := os.Getenv("KVGATE_TEST_REDIS"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/15"
}

// Client connects to the test Redis; the client is closed when the test ends.
func Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	url := URL()
	c, err := state.NewClient(url, state.ModeStandalone)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("test Redis at %s (KVGATE_TEST_REDIS): %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Open connects to the test Redis and returns a client and this test's key prefix, whose keys
// are deleted when the test ends.
func Open(t testing.TB) (redis.UniversalClient, string) {
	t.Helper()
	c := Client(t)
	prefix := fmt.Sprintf("kvgtest:%s:%d:", t.Name(), time.Now().UnixNano())
	// Registered after Client's Close, so it runs first (cleanups run last-in, first-out).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return c, prefix
}
