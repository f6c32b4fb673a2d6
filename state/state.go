// Package state is what gateway replicas share: incidents, quarantine flags, tenant limit cells
// and tenants added at run time, each in memory (one replica) or in Redis (many), under one key
// schema (keys.go). It owns the Redis client and every Lua script; canary and policy stay pure.
package state

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
)

// State is what replicas share: incidents, quarantine flags, tenants and limit cells. In memory
// for one replica, in Redis for many.
type State struct {
	Incidents  IncidentLog
	Quarantine Quarantine
	// FailClosed holds the models whose admission is fail-closed after count drift (flags like
	// quarantine's, keyed by model name; cleared by an operator).
	FailClosed Quarantine
	// Degraded reports that the shared store is unreachable (the gateway goes on from local
	// state and queues incident writes). Nil for memory state.
	Degraded func() bool
	// Tenants holds the tenants added at run time.
	Tenants TenantStore
	// Limits holds the tenant limit cells shared by replicas; nil for memory state (the
	// limiter then keeps them itself).
	Limits *RedisLimits
	// Prints shares prompt fingerprints between replicas; nil for memory state.
	Prints *RedisPrints
	// Evidence keeps the prompt-text matches that decide a quarantine (TextEvidence).
	Evidence TextEvidence
	// Run carries background work (the incident flusher); nil for memory state.
	Run    func(ctx context.Context)
	client redis.UniversalClient
	// unlog hands go-redis's process-wide logger back (redislog.go).
	unlog func()
}

// Open builds the state that cfg.State names. A Redis URL that does not parse is an error;
// a Redis that does not answer is not (the gateway starts degraded and catches up).
func Open(cfg *config.Config, log *zap.Logger) (*State, error) {
	if cfg.State.RedisURL == "" {
		inc := NewMemoryIncidents(10000)
		inc.TTL = cfg.Canary.IncidentTTL
		return &State{Incidents: inc, Quarantine: NewMemoryQuarantine(), FailClosed: NewMemoryQuarantine(), Tenants: NewMemoryTenants(), Evidence: NewMemoryTextEvidence()}, nil
	}
	client, err := NewClient(cfg.State.RedisURL, string(cfg.State.RedisMode))
	if err != nil {
		return nil, err
	}
	// go-redis's own messages (failed dials, pool trouble) go into this log as structured,
	// rate-limited warnings, not as plain text on stderr.
	unlog := useRedisLogger(NewRedisLogger(log, 0))
	inc := NewRedisIncidents(client, cfg.State.KeyPrefix, 100000, 10000)
	inc.TTL = cfg.Canary.IncidentTTL
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Warn("redis not answering at start: serving from local state, incident writes queue", zap.Error(err))
	}
	return &State{Incidents: inc, Quarantine: NewRedisQuarantine(client, cfg.State.KeyPrefix),
		FailClosed: NewRedisFailClosed(client, cfg.State.KeyPrefix),
		Tenants:    NewRedisTenants(client, cfg.State.KeyPrefix), Limits: NewRedisLimits(client, cfg.State.KeyPrefix),
		Degraded: inc.Degraded, Run: inc.Run, client: client, unlog: unlog, Evidence: NewRedisTextEvidence(client, cfg.State.KeyPrefix),
		Prints: NewRedisPrints(client, cfg.State.KeyPrefix, cfg.Canary.DetectWindow, 0)}, nil
}

// Ping asks the shared store for an answer now (nil for memory state): /readyz reports an
// unreachable Redis at once, not only after the next write or limiter call fails.
func (s *State) Ping(ctx context.Context) error {
	if s.client == nil {
		return nil
	}
	return s.client.Ping(ctx).Err()
}

// AddHook installs a go-redis hook on the shared client (nothing for memory state): tests count
// round trips with it.
func (s *State) AddHook(h redis.Hook) {
	if s.client != nil {
		s.client.AddHook(h)
	}
}

// Close releases the Redis client, if any.
func (s *State) Close() error {
	if s.client != nil {
		err := s.client.Close()
		s.unlog()
		return err
	}
	return nil
}
