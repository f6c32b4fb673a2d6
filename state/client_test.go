package state

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestNewClientStandaloneTalksToRedis(t *testing.T) {
	url := os.Getenv("KVGATE_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:6379/15"
	}
	for _, mode := range []string{"", "standalone", "Standalone"} {
		c, err := NewClient(url, mode)
		if err != nil {
			t.Fatalf("mode %q: %v", mode, err)
		}
		if _, ok := c.(*redis.Client); !ok {
			t.Fatalf("mode %q built %T, want *redis.Client", mode, c)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = c.Ping(ctx).Err()
		cancel()
		c.Close()
		if err != nil {
			t.Fatalf("mode %q: ping %s: %v", mode, url, err)
		}
	}
}

func TestNewClientModes(t *testing.T) {
	// Sentinel and cluster clients are only built here (no connection is made until a command).
	c, err := NewClient("redis://127.0.0.1:26379/0?master_name=mymaster&addr=127.0.0.1:26380", "sentinel")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*redis.Client); !ok { // go-redis's failover client is a *redis.Client
		t.Errorf("sentinel mode built %T", c)
	}
	c.Close()
	c, err = NewClient("redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", "cluster")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Errorf("cluster mode built %T", c)
	}
	c.Close()
}

func TestNewClientErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ url, mode, field string }{
		{"", "standalone", "state.redis_url"},
		{"http://127.0.0.1:6379", "standalone", "state.redis_url"},
		{"redis://127.0.0.1:6379/notanumber", "standalone", "state.redis_url"},
		{"redis://127.0.0.1:6379/0", "sentinel", "state.redis_url"}, // no master_name
		{"redis://127.0.0.1:6379/0", "replicated", "state.redis_mode"},
	} {
		_, err := NewClient(tc.url, tc.mode)
		if err == nil || !strings.HasPrefix(err.Error(), tc.field) {
			t.Errorf("NewClient(%q, %q) = %v, want an error starting with %s", tc.url, tc.mode, err, tc.field)
		}
	}
}
