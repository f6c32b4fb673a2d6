package gateway

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/internal/redisstate"
)

// State is what replicas share: incidents and quarantine flags. In memory for one replica, in
// Redis for many.
type State struct {
	Incidents  canary.IncidentLog
	Quarantine canary.Quarantine
	// Degraded reports that the shared store is unreachable (the gateway goes on from local
	// state and queues incident writes). Nil for memory state.
	Degraded func() bool
	// run carries background work (the incident flusher); nil for memory state.
	run    func(ctx context.Context)
	client redis.UniversalClient
}

// OpenState builds the state that cfg.State names. A Redis URL that does not parse is an error;
// a Redis that does not answer is not (the gateway starts degraded and catches up).
func OpenState(cfg *config.Config, log *zap.Logger) (*State, error) {
	if cfg.State.RedisURL == "" {
		return &State{Incidents: canary.NewMemoryIncidents(10000), Quarantine: canary.NewMemoryQuarantine()}, nil
	}
	client, err := redisstate.NewClient(cfg.State.RedisURL, string(cfg.State.RedisMode))
	if err != nil {
		return nil, err
	}
	inc := canary.NewRedisIncidents(client, cfg.State.KeyPrefix, 100000, 10000)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Warn("redis not answering at start: serving from local state, incident writes queue", zap.Error(err))
	}
	return &State{Incidents: inc, Quarantine: canary.NewRedisQuarantine(client, cfg.State.KeyPrefix),
		Degraded: inc.Degraded, run: inc.Run, client: client}, nil
}

// Close releases the Redis client, if any.
func (s *State) Close() error {
	if s.client != nil {
		return s.client.Close()
	}
	return nil
}
