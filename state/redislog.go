package state

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// go-redis reports what its pools and background work run into through one process-wide logger,
// which by default writes plain-text lines to stderr (into the middle of the JSON log). Open sends
// them to zap instead: one structured warning per kind of message, then at most one every
// redisLogEvery with the count of those held back, so an outage that fails every dial does not
// flood the log.

// redisLogEvery is how often one kind of go-redis message is written while it repeats.
const redisLogEvery = 30 * time.Second

// redisLogKinds bounds the kinds remembered (the formats are a fixed set in go-redis; the bound
// only matters for messages keyed by their text).
const redisLogKinds = 256

// RedisLogger is go-redis's logger (redis.SetLogger) writing to a zap logger, rate-limited by
// kind of message.
type RedisLogger struct {
	log   *zap.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*redisLogKind
}

type redisLogKind struct {
	last       time.Time // when it was last written
	suppressed int       // held back since
}

// NewRedisLogger writes go-redis's messages to log as warnings, each kind at most once per every
// (0: redisLogEvery).
func NewRedisLogger(log *zap.Logger, every time.Duration) *RedisLogger {
	if every <= 0 {
		every = redisLogEvery
	}
	return &RedisLogger{log: log.With(zap.String("component", "go-redis")), every: every, now: time.Now, kinds: map[string]*redisLogKind{}}
}

// go-redis has one logger per process, and a process may hold several States (tests do): the
// logger installed is a forwarder to the newest open State's logger. A State's Close hands it
// back to the one opened before; with none open, go-redis's messages are dropped.
var redisLogs struct {
	sync.Mutex
	installed bool
	open      []*RedisLogger
}

type redisForwarder struct{}

func (redisForwarder) Printf(ctx context.Context, format string, args ...any) {
	redisLogs.Lock()
	var l *RedisLogger
	if n := len(redisLogs.open); n > 0 {
		l = redisLogs.open[n-1]
	}
	redisLogs.Unlock()
	if l != nil {
		l.Printf(ctx, format, args...)
	}
}

// useRedisLogger routes go-redis's messages to l until release is called.
func useRedisLogger(l *RedisLogger) (release func()) {
	redisLogs.Lock()
	defer redisLogs.Unlock()
	if !redisLogs.installed {
		redis.SetLogger(redisForwarder{})
		redisLogs.installed = true
	}
	redisLogs.open = append(redisLogs.open, l)
	var once sync.Once
	return func() {
		once.Do(func() {
			redisLogs.Lock()
			defer redisLogs.Unlock()
			for i, o := range redisLogs.open {
				if o == l {
					redisLogs.open = append(redisLogs.open[:i], redisLogs.open[i+1:]...)
					break
				}
			}
		})
	}
}

// Printf is go-redis's logging call.
func (l *RedisLogger) Printf(_ context.Context, format string, args ...any) {
	msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, args...), "redis: "))
	key := format
	if f := strings.TrimSpace(format); f == "%s" || f == "%v" || f == "%+v" {
		key = msg // the format says nothing; the text is the kind
	}
	now := l.now()
	l.mu.Lock()
	k := l.kinds[key]
	if k != nil && now.Sub(k.last) < l.every {
		k.suppressed++
		l.mu.Unlock()
		return
	}
	if k == nil {
		if len(l.kinds) >= redisLogKinds {
			for key, old := range l.kinds { // forget kinds that have been quiet for a window
				if now.Sub(old.last) >= l.every {
					delete(l.kinds, key)
				}
			}
		}
		k = &redisLogKind{}
		if len(l.kinds) < redisLogKinds {
			l.kinds[key] = k
		}
	}
	suppressed := k.suppressed
	k.suppressed, k.last = 0, now
	l.mu.Unlock()
	fields := []zap.Field{zap.String("message", msg)}
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed", suppressed), zap.Duration("suppressed_over", l.every))
	}
	l.log.Warn("redis client", fields...)
}
