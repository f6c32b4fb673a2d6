package tenants_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
	"github.com/kvgate/kvgate/tests/tenantcase"
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
	if err := store.Create(ctx, config.Tenant{Name: "bob", KeySHA256: strings.ToUpper(config.SHA256Hex("kb")), TPM: 9}); err != nil {
		t.Fatal(err)
	}
	// Written around the admin API: clashes with a config tenant's name, so it is ignored.
	if err := store.Create(ctx, config.Tenant{Name: "alice", KeySHA256: config.SHA256Hex("kc")}); err != nil {
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
func TestDecodeNamesTheField(t *testing.T) {
	key := `"key_sha256":"` + config.SHA256Hex("k") + `"`
	for _, c := range []struct{ body, param string }{
		{`{"name":"x","key":"sk-1"}`, "key"},
		{`{"name":"x","api_key":"sk-1"}`, "api_key"},
		{`{"name":"x"}`, "key_sha256"},
		{`{"name":"x","key_sha256":"abc"}`, "key_sha256"},
		{`{"name":"x",` + key + `,"rpm":-1}`, "rpm"},
		{`{"name":"x",` + key + `,"tpm":-5}`, "tpm"},
		{`{"name":"x",` + key + `,"max_concurrent":-1}`, "max_concurrent"},
		{`{"name":"x",` + key + `,"max_prompt_tokens":-1}`, "max_prompt_tokens"},
		{`{"name":"x",` + key + `,"max_prompt_bytes":-1}`, "max_prompt_bytes"},
		{`{"name":"x",` + key + `,"max_prompt_bytes":1e30}`, "max_prompt_bytes"},
		{`{"name":"x",` + key + `,"weight":-1}`, "weight"},
		{`{"name":"x",` + key + `,"weight":1001}`, "weight"},
		{`{"name":"x",` + key + `,"weight":"heavy"}`, "weight"},
		{`{"name":"x",` + key + `,"rpm":1.5}`, "rpm"},
		{`{"name":"x",` + key + `,"canary_opt_out":"yes"}`, "canary_opt_out"},
		{`{"name":"x","colour":"red"}`, "colour"},
		// Go's decoder keeps the last of duplicate keys and matches case-insensitively: rpm 5
		// then rpm 0 would be stored as no limit at all.
		{`{"name":"x",` + key + `,"rpm":5,"rpm":0}`, "rpm"},
		{`{"name":"x",` + key + `,"tpm":100,"TPM":0}`, "TPM"},
		{`{"name":"x",` + key + `,"name":"y"}`, "name"},
		{`{"name":"x"`, ""},
	} {
		var r config.Tenant
		e := tenants.Decode([]byte(c.body), &r)
		if e == nil {
			e = tenants.Validate(&r)
		}
		if e == nil || e.Status != 400 || e.Param != c.param || (c.param != "" && !strings.Contains(e.Message, c.param)) {
			t.Errorf("%s: %+v, want a 400 naming %q", c.body, e, c.param)
		}
	}
	var r config.Tenant
	if e := tenants.Decode([]byte(`{"name":"x","key_sha256":"`+strings.ToUpper(config.SHA256Hex("k"))+`","tpm":7,"canary_opt_out":true}`), &r); e != nil || tenants.Validate(&r) != nil ||
		r.KeySHA256 != config.SHA256Hex("k") || r.TPM != 7 || !r.CanaryOptOut || r.Weight != 1 {
		t.Fatalf("valid body: %+v %+v", e, r)
	}
	// A PATCH body changes what it names and keeps the rest.
	if e := tenants.Decode([]byte(`{"weight":2.5}`), &r); e != nil || r.Weight != 2.5 || r.TPM != 7 || !r.CanaryOptOut {
		t.Fatalf("patch: %+v %+v", e, r)
	}
	if tenants.ValidName("") || tenants.ValidName("a b") || !tenants.ValidName("team-a_1.x") {
		t.Fatal("ValidName")
	}
}

// Every attribute a file tenant has reaches a run-time tenant: through the admin API's body, the
// store and the directory, and back out in the admin API's view.
func TestRunTimeTenantCarriesEveryAttribute(t *testing.T) {
	full := tenantcase.Full("full", "k-full")
	body, err := json.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	var r config.Tenant
	if e := tenants.Decode(body, &r); e != nil || tenants.Validate(&r) != nil || r != full {
		t.Fatalf("decoded %+v (%v), want %+v", r, e, full)
	}
	store := state.NewMemoryTenants()
	if err := store.Create(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	d := tenants.NewDirectory(nil, store, zap.NewNop())
	d.Sync(context.Background())
	if got := d.ByKey([]byte("k-full")); got == nil || got.Tenant != full {
		t.Fatalf("directory: %+v, want %+v", got, full)
	}
	view, _ := json.Marshal(tenants.ViewOf(full, "runtime"))
	var back map[string]any
	_ = json.Unmarshal(view, &back)
	var want map[string]any
	_ = json.Unmarshal(body, &want)
	for k, v := range want {
		if k == "key_sha256" {
			if _, shown := back[k]; shown || back["key_sha256_prefix"] != full.KeySHA256[:8] {
				t.Fatalf("the view shows the key hash: %s", view)
			}
			continue
		}
		if back[k] != v {
			t.Errorf("view %s = %v, want %v", k, back[k], v)
		}
	}
}
