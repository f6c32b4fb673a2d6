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

// Issue 31: /metrics was public unless metrics_auth: admin was set. By default it now needs the
// scrape key (server.metrics_key_sha256) or the admin key; a tenant's key, a wrong key or none
// gets 401 and no series. With no key configured at all the 401 says what to set, and
// metrics_auth: none stays an explicit way to publish it.
func TestMetricsNeedAKeyByDefault(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "8192", "--context-length", "8192")
	base := fmt.Sprintf(`backends: [{name: sim, url: %q, role: unified}]
tenants: [{name: tenant-with-a-secret-name, key_sha256: %q, tpm: 100000}]
capacity: {poll_interval: 100ms}
`, sim.URL, testkit.KeySHA256("t-key"))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, base+fmt.Sprintf("admin_key_sha256: %q\nserver: {metrics_key_sha256: %q}\n",
		testkit.KeySHA256("admin-key"), testkit.KeySHA256("scrape-key"))))
	if r := post(t, gw.URL, "/generate", "t-key", `{"text":"hello","sampling_params":{"max_new_tokens":2}}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	for _, key := range []string{"", "t-key", "wrong"} {
		r := get(t, gw.URL+"/metrics", key)
		if r.status != 401 || strings.Contains(string(r.body), "tenant-with-a-secret-name") || strings.Contains(string(r.body), "kvgate_") {
			t.Fatalf("/metrics with key %q: %d %.300s", key, r.status, r.body)
		}
	}
	for _, key := range []string{"scrape-key", "admin-key"} {
		if r := get(t, gw.URL+"/metrics", key); r.status != 200 || !strings.Contains(string(r.body), `tenant="tenant-with-a-secret-name"`) {
			t.Fatalf("/metrics with %s: %d, tenant series missing", key, r.status)
		}
	}
	// The scrape key opens nothing else.
	if r := get(t, gw.URL+"/admin/backends", "scrape-key"); r.status != 401 {
		t.Fatalf("/admin/backends with the scrape key: %d", r.status)
	}

	bare := testkit.StartGateway(t, testkit.ParseConfig(t, base))
	r := get(t, bare.URL+"/metrics", "")
	if r.status != 401 || !strings.Contains(string(r.body), "server.metrics_key_sha256") || strings.Contains(string(r.body), "kvgate_") {
		t.Fatalf("/metrics with no key configured: %d %.300s", r.status, r.body)
	}

	public := testkit.StartGateway(t, testkit.ParseConfig(t, base+"server: {metrics_auth: none}\n"))
	if r := get(t, public.URL+"/metrics", ""); r.status != 200 || !strings.Contains(string(r.body), "kvgate_") {
		t.Fatalf("/metrics with metrics_auth none: %d", r.status)
	}
}
