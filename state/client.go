package state

// The one Redis client that every piece of shared state uses: only the translation of
// state.redis_url and state.redis_mode into a go-redis UniversalClient. It never issues commands
// at construction time, nor hides a configuration error behind a default.

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Modes accepted by NewClient.
const (
	ModeStandalone = "standalone"
	ModeSentinel   = "sentinel"
	ModeCluster    = "cluster"
)

// boundCalls: every client honours its callers' context deadlines (go-redis ignores them unless
// ContextTimeoutEnabled is set, and waits out its own 3 s read timeout instead), so a rate-limit
// check bounded at 100 ms never holds a request longer when Redis stops answering.

// NewClient builds one redis.UniversalClient from url and mode ("standalone" | "sentinel" |
// "cluster"; empty means standalone), using go-redis's ParseURL, ParseFailoverURL and
// ParseClusterURL. It does not connect: the first command does. Errors name the config field
// (state.redis_url or state.redis_mode) so an operator can find the bad line.
func NewClient(url, mode string) (redis.UniversalClient, error) {
	if strings.TrimSpace(url) == "" {
		return nil, fmt.Errorf("state.redis_url: empty")
	}
	switch strings.ToLower(strings.TrimSpace(mode)) {
	case "", ModeStandalone:
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("state.redis_url (mode %s): %w", ModeStandalone, err)
		}
		opt.ContextTimeoutEnabled = true // see boundCalls
		return redis.NewClient(opt), nil
	case ModeSentinel:
		opt, err := redis.ParseFailoverURL(url)
		if err != nil {
			return nil, fmt.Errorf("state.redis_url (mode %s): %w", ModeSentinel, err)
		}
		if opt.MasterName == "" {
			// go-redis accepts it, but a failover client cannot find a master without its name.
			return nil, fmt.Errorf("state.redis_url (mode %s): missing ?master_name=<name>", ModeSentinel)
		}
		opt.ContextTimeoutEnabled = true
		return redis.NewFailoverClient(opt), nil
	case ModeCluster:
		opt, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("state.redis_url (mode %s): %w", ModeCluster, err)
		}
		opt.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opt), nil
	default:
		return nil, fmt.Errorf("state.redis_mode: %q is not one of standalone, sentinel, cluster", mode)
	}
}
