package state

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// go-redis's messages become structured warnings, one per kind per window, the next one saying
// how many were held back.
func TestRedisLoggerRateLimitsByKind(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := NewRedisLogger(zap.New(core), 30*time.Second)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	for i := 0; i < 24; i++ {
		l.Printf(context.Background(), dial, 5, "dial tcp 127.0.0.1:6379: connect: connection refused")
		now = now.Add(100 * time.Millisecond)
	}
	l.Printf(context.Background(), "Conn has unread data (not push notification), removing it")
	if n := logs.Len(); n != 2 {
		t.Fatalf("24 failed dials and one other message: want 2 lines, got %d: %v", n, logs.All())
	}
	first := logs.All()[0]
	if first.Level != zapcore.WarnLevel || first.Message != "redis client" ||
		first.ContextMap()["message"] != "connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:6379: connect: connection refused" ||
		first.ContextMap()["component"] != "go-redis" {
		t.Fatalf("first line: %v %q %v", first.Level, first.Message, first.ContextMap())
	}
	now = now.Add(30 * time.Second)
	l.Printf(context.Background(), dial, 5, "refused again")
	last := logs.All()[logs.Len()-1]
	if logs.Len() != 3 || last.ContextMap()["suppressed"] != int64(23) {
		t.Fatalf("after the window: want a third line with suppressed=23, got %d lines, last %v", logs.Len(), last.ContextMap())
	}
}

// The process-wide go-redis logger follows the newest open State and is handed back on Close.
func TestRedisLoggerFollowsOpenStates(t *testing.T) {
	c1, l1 := observer.New(zapcore.DebugLevel)
	c2, l2 := observer.New(zapcore.DebugLevel)
	r1 := useRedisLogger(NewRedisLogger(zap.New(c1), 0))
	r2 := useRedisLogger(NewRedisLogger(zap.New(c2), 0))
	redisForwarder{}.Printf(context.Background(), "one %d", 1)
	r2()
	redisForwarder{}.Printf(context.Background(), "two %d", 2)
	r1()
	redisForwarder{}.Printf(context.Background(), "three %d", 3)
	if l1.Len() != 1 || l2.Len() != 1 || l2.All()[0].ContextMap()["message"] != "one 1" || l1.All()[0].ContextMap()["message"] != "two 2" {
		t.Fatalf("first state: %v, second: %v", l1.All(), l2.All())
	}
}
