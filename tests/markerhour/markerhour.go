// Package markerhour pins the hour whose canary markers a test's gateways inject and detect.
//
// A keyring derives markers from the clock (epoch = unix time / canary.epoch), so a test on the
// wall clock meets other markers every hour, and what a simulated leak quotes, and whether the
// quote holds a marker, changes with them (issue 37: a leak test red at 18:00 UTC only). Tests
// use the markers of one fixed hour instead, At: 2026-12-04 00:00 UTC, or KVGATE_TEST_HOUR hours
// after it to explore others. A gateway gets them through an ordinary setting with an odd value:
// canary.epoch = EpochLen(), an epoch length within a fraction of a percent of an hour, chosen so
// that the wall clock falls early in epoch number Epoch(), the number an hour-long epoch has at
// At, and stays in it for about 57 minutes. The product reads no test knob.
package markerhour

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
)

// Env names the variable that moves At: an integer number of hours after 2026-12-04 00:00 UTC.
const Env = "KVGATE_TEST_HOUR"

// base is the hour tests use unless Env moves them.
var base = time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)

// At is the hour whose markers tests use. A value of Env that is not an integer panics: a sweep
// that silently ran the default hour would prove nothing.
func At() time.Time {
	v := os.Getenv(Env)
	if v == "" {
		return base
	}
	h, err := strconv.Atoi(v)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: want a whole number of hours after %s", Env, v, base.Format(time.RFC3339)))
	}
	return base.Add(time.Duration(h) * time.Hour)
}

// Epoch is the epoch number of At with hour-long epochs: the number every pinned keyring and
// gateway is in.
func Epoch() uint64 { return epochOf(At()) }

func epochOf(at time.Time) uint64 { return uint64(at.Unix()) / 3600 }

var (
	lenOnce  sync.Once
	epochLen time.Duration
)

// EpochLen is the canary.epoch under which the wall clock lies 5% into epoch Epoch(), so the
// markers stay those of At for the next 95% of an epoch (about 57 minutes, longer than any test
// run). It is computed once per process, so every gateway and keyring of a test run agrees.
func EpochLen() time.Duration {
	lenOnce.Do(func() { epochLen = EpochLenAt(At()) })
	return epochLen
}

// EpochLenAt is the canary.epoch under which the wall clock lies 5% into the hourly epoch of at,
// for a test that sweeps hours in one process (a gateway for each).
func EpochLenAt(at time.Time) time.Duration {
	now := time.Now().UnixNano()
	l := time.Duration(float64(now) / (float64(epochOf(at)) + 0.05))
	if uint64(now)/uint64(l) != epochOf(at) {
		panic(fmt.Sprintf("markerhour: epoch length %d ns does not put now in epoch %d", l, epochOf(at)))
	}
	return l
}

// Pin gives cfg the pinned markers: a canary section left at the default epoch (1 h) gets
// EpochLen. A test that set an epoch of its own keeps it (it tests rotation itself).
func Pin(cfg *config.Config) {
	if cfg.Canary.Epoch == time.Hour {
		cfg.Canary.Epoch = EpochLen()
		if cfg.Canary.DetectWindow < cfg.Canary.Epoch {
			cfg.Canary.DetectWindow = cfg.Canary.Epoch
		}
	}
}

// Marker is tenant's marker under secret at At: the one a pinned gateway injects now.
func Marker(secret, tenant string) string { return MarkerAt(secret, tenant, At()) }

// MarkerAt is tenant's marker under secret in the hourly epoch of at: the one a gateway with
// canary.epoch EpochLenAt(at) injects now.
func MarkerAt(secret, tenant string, at time.Time) string {
	return canary.Marker([]byte(secret), tenant, epochOf(at))
}

// Keyring is a keyring under secret that, read on the wall clock, is in the pinned epoch (as a
// pinned gateway's is), with the default detect window.
func Keyring(secret string, tenants ...string) *canary.Keyring {
	return canary.NewKeyring([]byte(secret), EpochLen(), 24*time.Hour, tenants)
}
