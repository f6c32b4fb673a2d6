package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Reload in process: a second model (its own engine), a new tenant and a new overflow status
// apply at once; a file the set cannot build (a missing CA) changes nothing.
func TestReloadModelsTenantsPolicy(t *testing.T) {
	small := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "2048", "--context-length", "4096")
	big := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "16384", "--context-length", "32768")
	one := fmt.Sprintf("backends:\n  - {name: small-0, url: %q, role: unified, model: small}\ntenants:\n  - {name: alice, key_sha256: %q}\ncapacity: {poll_interval: 100ms}\n",
		small.URL, testkit.KeySHA256(tenantKey))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, one))
	long := fmt.Sprintf(`{"model":"big","messages":[{"role":"user","content":%q}],"max_tokens":4}`, words(1500))
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, long); r.status != 404 {
		t.Fatalf("big before the reload: %d %s", r.status, r.body)
	}
	two := fmt.Sprintf("backends:\n  - {name: small-0, url: %q, role: unified, model: small}\n  - {name: big-0, url: %q, role: unified, model: big}\n"+
		"tenants:\n  - {name: alice, key_sha256: %q}\n  - {name: bob, key_sha256: %q}\ncapacity: {poll_interval: 100ms}\npolicy: {overflow_status: 400}\n",
		small.URL, big.URL, testkit.KeySHA256(tenantKey), testkit.KeySHA256("sk-bob"))
	if err := gw.GW.Reload(testkit.ParseConfig(t, two)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "big's engine read", func() bool { b := gw.Set.Get("big-0"); return b != nil && b.Capacity() != nil })
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-bob", long); r.status != 200 {
		t.Fatalf("bob, big, after the reload: %d %s", r.status, r.body)
	}
	tooLong := fmt.Sprintf(`{"model":"small","messages":[{"role":"user","content":%q}],"max_tokens":4}`, words(1500))
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, tooLong); r.status != 400 || decodeError(t, r).Error.Code != "context_length_exceeded" {
		t.Fatalf("overflow_status 400 after the reload: %d %s", r.status, r.body)
	}
	bad := testkit.ParseConfig(t, two)
	bad.Backends[1].URL = "https://127.0.0.1:1"
	bad.Backends[1].TLS.CAFile = "/nonexistent/ca.pem" // parsed config, then the file vanished
	if err := gw.GW.Reload(bad); err == nil {
		t.Fatal("a reload whose backend cannot be built must fail")
	}
	if r := post(t, gw.URL, "/v1/chat/completions", "sk-bob", long); r.status != 200 {
		t.Fatalf("after a failed reload the running configuration must stay: %d %s", r.status, r.body)
	}
}
