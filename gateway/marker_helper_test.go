package gateway_test

import (
	"testing"

	"github.com/kvgate/kvgate/tests/markerhour"
)

// markerFor is tenant's marker under secret, the one gateways of these tests inject: that of the
// pinned test hour (their configs come from testkit.ParseConfig, which pins it).
func markerFor(t testing.TB, secret, tenant string) string {
	t.Helper()
	return markerhour.Marker(secret, tenant)
}
