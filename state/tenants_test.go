package state_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/tenantcase"
)

func TestTenantStores(t *testing.T) {
	client, prefix := testRedis(t)
	for name, s := range map[string]state.TenantStore{"memory": state.NewMemoryTenants(), "redis": state.NewRedisTenants(client, prefix)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			v0, err := s.Version(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a := config.Tenant{Name: "a", KeySHA256: strings.Repeat("a", 64), RPM: 20}
			if err := s.Create(ctx, a); err != nil {
				t.Fatal(err)
			}
			if err := s.Create(ctx, a); !errors.Is(err, state.ErrTenantExists) {
				t.Fatalf("second create: %v", err)
			}
			b := config.Tenant{Name: "b", KeySHA256: a.KeySHA256}
			if err := s.Create(ctx, b); !errors.Is(err, state.ErrKeyInUse) {
				t.Fatalf("a key belongs to one tenant: %v", err)
			}
			b.KeySHA256 = strings.Repeat("b", 64)
			if err := s.Create(ctx, b); err != nil {
				t.Fatal(err)
			}
			if v1, _ := s.Version(ctx); v1 == v0 {
				t.Fatal("writes must move the version")
			}
			// Rotating a's key frees the old one.
			a.KeySHA256, a.TPM = strings.Repeat("c", 64), 500
			if err := s.Update(ctx, a); err != nil {
				t.Fatal(err)
			}
			if err := s.Create(ctx, config.Tenant{Name: "d", KeySHA256: strings.Repeat("a", 64)}); err != nil {
				t.Fatalf("the rotated-out key is free again: %v", err)
			}
			if err := s.Update(ctx, config.Tenant{Name: "a", KeySHA256: b.KeySHA256}); !errors.Is(err, state.ErrKeyInUse) {
				t.Fatalf("update onto b's key: %v", err)
			}
			got, err := s.Get(ctx, "a")
			if err != nil || got.TPM != 500 || got.RPM != 20 || got.KeySHA256 != strings.Repeat("c", 64) {
				t.Fatalf("Get a = %+v, %v", got, err)
			}
			if err := s.Delete(ctx, "b"); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, "b"); !errors.Is(err, state.ErrTenantNotFound) {
				t.Fatalf("second delete: %v", err)
			}
			if err := s.Update(ctx, config.Tenant{Name: "zz", KeySHA256: strings.Repeat("e", 64)}); !errors.Is(err, state.ErrTenantNotFound) {
				t.Fatalf("update of a missing tenant: %v", err)
			}
			list, _ := s.List(ctx)
			if len(list) != 2 || list[0].Name != "a" || list[1].Name != "d" {
				t.Fatalf("List = %+v", list)
			}
			if err := s.Create(ctx, config.Tenant{Name: "e", KeySHA256: b.KeySHA256}); err != nil {
				t.Fatalf("a deleted tenant's key is free: %v", err)
			}
		})
	}
}

// Every attribute of a tenant survives the store (memory and Redis), and a record written before
// an attribute existed reads with the file's default (weight 1).
func TestTenantStoresKeepEveryAttribute(t *testing.T) {
	client, prefix := testRedis(t)
	for name, s := range map[string]state.TenantStore{"memory": state.NewMemoryTenants(), "redis": state.NewRedisTenants(client, prefix)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			full := tenantcase.Full("full", "k-full")
			if err := s.Create(ctx, full); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Get(ctx, "full"); err != nil || got != full {
				t.Fatalf("Get = %+v, %v; want %+v", got, err, full)
			}
			if list, err := s.List(ctx); err != nil || len(list) != 1 || list[0] != full {
				t.Fatalf("List = %+v, %v", list, err)
			}
		})
	}
	// A record as written before weights existed (no "weight" key).
	old := `{"name":"old","key_sha256":"` + strings.Repeat("d", 64) + `","max_prompt_tokens":0,"canary_opt_out":false,"rpm":3,"tpm":0,"max_concurrent":0}`
	if err := client.HSet(context.Background(), state.Keys{Prefix: prefix}.Tenants()[0], "old", old).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := state.NewRedisTenants(client, prefix).Get(context.Background(), "old")
	if err != nil || got.Weight != 1 || got.RPM != 3 {
		t.Fatalf("an old record: %+v, %v; want weight 1, rpm 3", got, err)
	}
}
