package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Issue 15: the unauthenticated /metrics listed tenant names with their token volumes. With
// server.metrics_auth: admin, no series (tenant-labelled ones included) is readable without the
// admin key: not anonymously, not with a tenant's key; the admin key reads them all.
func TestMetricsBehindTheAdminKey(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	yaml := fmt.Sprintf(`admin_key_sha256: %q
backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: tenant-with-a-secret-name, key_sha256: %q, tpm: 100000}]
capacity: {poll_interval: 100ms}
server: {metrics_auth: admin}
`, testkit.KeySHA256("admin-key"), sim.URL, testkit.KeySHA256("t-key"))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	if r := post(t, gw.URL, "/generate", "t-key", `{"text":"hello","sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	for _, key := range []string{"", "t-key", "wrong"} {
		r := get(t, gw.URL+"/metrics", key)
		if r.status != 401 || strings.Contains(string(r.body), "tenant-with-a-secret-name") || strings.Contains(string(r.body), "kvgate_") {
			t.Fatalf("/metrics with key %q: %d %.300s", key, r.status, r.body)
		}
	}
	r := get(t, gw.URL+"/metrics", "admin-key")
	if r.status != 200 || !strings.Contains(string(r.body), `tenant="tenant-with-a-secret-name"`) {
		t.Fatalf("/metrics with the admin key: %d, tenant series missing", r.status)
	}
}
