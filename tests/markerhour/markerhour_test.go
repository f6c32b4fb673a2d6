package markerhour

import (
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
)

// A pinned keyring, read on the wall clock, hands out the markers an hour-long keyring has at
// At, whatever the hour the test runs.
func TestPinnedKeyringHasTheMarkersOfAt(t *testing.T) {
	for _, h := range []string{"", "0", "18", "31", "-5", "1000"} {
		t.Setenv(Env, h)
		at := At()
		hourly := canary.NewKeyring([]byte("markerhour test secret"), time.Hour, 24*time.Hour, []string{"alice"})
		want, wantEpoch := hourly.Current("alice", at)
		lenOnce = sync.Once{} // each hour its own length (a process computes it once)
		got, epoch := Keyring("markerhour test secret", "alice").Current("alice", time.Now())
		if got != want || epoch != wantEpoch || epoch != Epoch() || Marker("markerhour test secret", "alice") != want {
			t.Errorf("%s=%q: pinned marker %s (epoch %d), want %s (epoch %d)", Env, h, got, epoch, want, wantEpoch)
		}
		now := time.Now()
		if left := time.Duration(Epoch()+1)*EpochLen() - time.Duration(now.UnixNano()); left < 50*time.Minute {
			t.Errorf("%s=%q: the pinned epoch ends %v after now, want the better part of an hour", Env, h, left)
		}
	}
}

func TestPinKeepsATestsOwnEpoch(t *testing.T) {
	cfg := &config.Config{}
	cfg.Canary.Epoch, cfg.Canary.DetectWindow = time.Hour, 24*time.Hour
	Pin(cfg)
	if cfg.Canary.Epoch != EpochLen() {
		t.Errorf("default epoch not pinned: %v", cfg.Canary.Epoch)
	}
	cfg.Canary.Epoch = time.Minute
	Pin(cfg)
	if cfg.Canary.Epoch != time.Minute {
		t.Errorf("a test's own epoch was replaced: %v", cfg.Canary.Epoch)
	}
}

func TestAtRefusesAWrongHour(t *testing.T) {
	t.Setenv(Env, "18h")
	defer func() {
		if recover() == nil {
			t.Error("KVGATE_TEST_HOUR=18h ran the default hour instead of refusing")
		}
	}()
	At()
}

// A gateway of a sweep, at canary.epoch EpochLenAt(at), injects MarkerAt(at) now.
func TestEpochLenAtSweepsHoursInOneProcess(t *testing.T) {
	for h := 0; h < 48; h++ {
		at := base.Add(time.Duration(h) * time.Hour)
		hourly, _ := canary.NewKeyring([]byte("sweep"), time.Hour, 24*time.Hour, []string{"a"}).Current("a", at)
		got, _ := canary.NewKeyring([]byte("sweep"), EpochLenAt(at), 24*time.Hour, []string{"a"}).Current("a", time.Now())
		if got != hourly || MarkerAt("sweep", "a", at) != hourly {
			t.Fatalf("hour %d: %s, want %s", h, got, hourly)
		}
	}
}
