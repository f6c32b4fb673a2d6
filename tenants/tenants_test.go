package tenants_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
)

// The directory serves the config file's tenants, adds run-time tenants from the store on sync,
// refuses ones that clash with the config file, and finds each by its key.
func TestDirectoryConfigAndRunTime(t *testing.T) {
	store := state.NewMemoryTenants()
	d := tenants.NewDirectory(tenants.FromConfig([]config.Tenant{{Name: "alice", KeySHA256: config.SHA256Hex("ka"), RPM: 5}}), store, zap.NewNop())
	var added []string
	d.OnAdd = func(n string) { added = append(added, n) }
	if a := d.ByKey([]byte("ka")); a == nil || a.Name != "alice" || a.Limits() != (limits.Rates{RPM: 5}) {
		t.Fatalf("config tenant by key: %+v", a)
	}
	if d.ByKey([]byte("kb")) != nil || d.ByKey(nil) != nil {
		t.Fatal("an unknown key found a tenant")
	}
	ctx := context.Background()
	if err := store.Create(ctx, state.TenantRecord{Name: "bob", KeySHA256: strings.ToUpper(config.SHA256Hex("kb")), Rates: limits.Rates{TPM: 9}}); err != nil {
		t.Fatal(err)
	}
	// Written around the admin API: clashes with a config tenant's name, so it is ignored.
	if err := store.Create(ctx, state.TenantRecord{Name: "alice", KeySHA256: config.SHA256Hex("kc")}); err != nil {
		t.Fatal(err)
	}
	d.Sync(ctx)
	if b := d.ByKey([]byte("kb")); b == nil || b.Name != "bob" || b.TPM != 9 {
		t.Fatalf("run-time tenant by key: %+v", b)
	}
	if d.ByKey([]byte("kc")) != nil || len(d.List()) != 2 || len(added) != 1 || added[0] != "bob" {
		t.Fatalf("clashing run-time tenant served: %d tenants, added %v", len(d.List()), added)
	}
	if d.Configured("bob") != nil || d.Configured("alice") == nil || !d.KeyClash(config.SHA256Hex("ka")) || d.KeyClash(config.SHA256Hex("kb")) {
		t.Fatal("Configured and KeyClash see only the config file's tenants")
	}
	if s1, s2 := d.ByKey([]byte("ka")).CacheSalt(), d.ByKey([]byte("kb")).CacheSalt(); s1 == s2 || len(s1) != 32 {
		t.Fatalf("salts %q %q", s1, s2)
	}
}

// An admin body names the field at fault; a raw key is refused, never stored.
func TestFieldsValidate(t *testing.T) {
	for _, c := range []struct{ body, param string }{
		{`{"name":"x","key":"sk-1"}`, "key"},
		{`{"name":"x","api_key":"sk-1"}`, "api_key"},
		{`{"name":"x","key_sha256":"abc"}`, "key_sha256"},
		{`{"name":"x","key_sha256":"` + config.SHA256Hex("k") + `","rpm":-1}`, "rpm"},
		{`{"name":"x","key_sha256":"` + config.SHA256Hex("k") + `","tpm":-5}`, "tpm"},
		{`{"name":"x","colour":"red"}`, ""},
	} {
		f, e := tenants.DecodeFields([]byte(c.body))
		if e == nil {
			var r state.TenantRecord
			e = f.Apply(&r)
		}
		if e == nil || e.Status != 400 || e.Param != c.param {
			t.Errorf("%s: %+v, want a 400 naming %q", c.body, e, c.param)
		}
	}
	f, e := tenants.DecodeFields([]byte(`{"name":"x","key_sha256":"` + strings.ToUpper(config.SHA256Hex("k")) + `","tpm":7,"canary_opt_out":true}`))
	var r state.TenantRecord
	if e != nil || f.Apply(&r) != nil || r.KeySHA256 != config.SHA256Hex("k") || r.TPM != 7 || !r.CanaryOptOut {
		t.Fatalf("valid body: %+v %+v", e, r)
	}
	if tenants.ValidName("") || tenants.ValidName("a b") || !tenants.ValidName("team-a_1.x") {
		t.Fatal("ValidName")
	}
}
