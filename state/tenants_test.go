package state_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
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
			a := state.TenantRecord{Name: "a", KeySHA256: strings.Repeat("a", 64), Rates: limits.Rates{RPM: 20}}
			if err := s.Create(ctx, a); err != nil {
				t.Fatal(err)
			}
			if err := s.Create(ctx, a); !errors.Is(err, state.ErrTenantExists) {
				t.Fatalf("second create: %v", err)
			}
			b := state.TenantRecord{Name: "b", KeySHA256: a.KeySHA256}
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
			if err := s.Create(ctx, state.TenantRecord{Name: "d", KeySHA256: strings.Repeat("a", 64)}); err != nil {
				t.Fatalf("the rotated-out key is free again: %v", err)
			}
			if err := s.Update(ctx, state.TenantRecord{Name: "a", KeySHA256: b.KeySHA256}); !errors.Is(err, state.ErrKeyInUse) {
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
			if err := s.Update(ctx, state.TenantRecord{Name: "zz", KeySHA256: strings.Repeat("e", 64)}); !errors.Is(err, state.ErrTenantNotFound) {
				t.Fatalf("update of a missing tenant: %v", err)
			}
			list, _ := s.List(ctx)
			if len(list) != 2 || list[0].Name != "a" || list[1].Name != "d" {
				t.Fatalf("List = %+v", list)
			}
			if err := s.Create(ctx, state.TenantRecord{Name: "e", KeySHA256: b.KeySHA256}); err != nil {
				t.Fatalf("a deleted tenant's key is free: %v", err)
			}
		})
	}
}
