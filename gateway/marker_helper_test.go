package gateway_test

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/canary"
)

// markerFor is tenant's current marker under secret (default epoch length).
func markerFor(t testing.TB, secret, tenant string) string {
	t.Helper()
	m, _ := canary.NewKeyring([]byte(secret), time.Hour, 24*time.Hour, []string{tenant}).Current(tenant, time.Now())
	return m
}
