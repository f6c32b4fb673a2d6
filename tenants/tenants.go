// Package tenants is who may call the gateway: one Tenant type (a config tenant with its key
// hash), and the Directory of the config file's tenants plus those added at run time, kept in
// sync with the shared store, looked up by key in constant time. It knows nothing of HTTP.
package tenants

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
)

// Tenant is one tenant: its configuration and the SHA-256 of its key.
type Tenant struct {
	config.Tenant
	Hash    []byte
	runtime bool // added at run time (the store), not by the config file
}

// Limits are the tenant's rate and concurrency limits.
func (t *Tenant) Limits() limits.Rates {
	return limits.Rates{RPM: t.RPM, TPM: t.TPM, MaxConcurrent: t.MaxConcurrent}
}

// CacheSalt is the tenant's prefix-cache partition: an HMAC of its key hash, so it is stable
// across replicas and restarts, secret to other tenants, and never the key itself.
func (t *Tenant) CacheSalt() string { return t.salt().s }

// CacheSaltJSON is CacheSalt as a JSON string (hex: nothing to escape), for engine bodies. The
// slice is shared: read it, never write it.
func (t *Tenant) CacheSaltJSON() []byte { return t.salt().js }

func (t *Tenant) salt() salt {
	salts.mu.RLock()
	s, ok := salts.m[string(t.Hash)]
	salts.mu.RUnlock()
	if ok {
		return s
	}
	m := hmac.New(sha256.New, t.Hash)
	m.Write([]byte("kvgate cache_salt v1"))
	s.s = hex.EncodeToString(m.Sum(nil)[:16])
	s.js = []byte(`"` + s.s + `"`)
	salts.mu.Lock()
	if len(salts.m) >= maxSalts {
		clear(salts.m) // run-time tenants come and go: the cache stays bounded
	}
	salts.m[string(t.Hash)] = s
	salts.mu.Unlock()
	return s
}

// salts caches CacheSalt by key hash: an HMAC per request cost 8 allocations and ~3 µs
// (issue 23). The salt is a pure function of the hash, so the cache is never stale.
var salts = struct {
	mu sync.RWMutex
	m  map[string]salt
}{m: map[string]salt{}}

// salt is one tenant's cache salt, as text and as the JSON string engine bodies carry.
type salt struct {
	s  string
	js []byte
}

const maxSalts = 4096

// FromConfig is the tenants of the config file (their key hashes were validated by config).
func FromConfig(cfg []config.Tenant) []Tenant {
	out := make([]Tenant, 0, len(cfg))
	for _, t := range cfg {
		h, _ := hex.DecodeString(strings.ToLower(t.KeySHA256))
		out = append(out, Tenant{Tenant: t, Hash: h})
	}
	return out
}

// SyncInterval is how often a replica checks the shared tenant list's version: a tenant added or
// deleted on one replica is seen by every other within it (well under one second).
const SyncInterval = 250 * time.Millisecond

// Directory is the current tenant list: the config file's, then those added at run time.
type Directory struct {
	base  atomic.Pointer[[]Tenant] // the config file's (SetBase replaces them on a reload)
	store state.TenantStore
	log   *zap.Logger
	// OnAdd is told each run-time tenant's name as it is loaded (the keyring learns it).
	OnAdd func(name string)

	all     atomic.Pointer[[]Tenant]
	syncMu  sync.Mutex // one sync at a time (the loop and admin writes)
	version int64
	synced  bool
}

// NewDirectory is a directory of base plus the run-time tenants in store (nil: none).
func NewDirectory(base []Tenant, store state.TenantStore, log *zap.Logger) *Directory {
	d := &Directory{store: store, log: log}
	d.base.Store(&base)
	list := base
	d.all.Store(&list)
	return d
}

// List is the current tenant list.
func (d *Directory) List() []Tenant { return *d.all.Load() }

// ByKey is the tenant whose key is key, or nil. Every tenant's hash is compared in constant time,
// so timing says nothing about which (or whether a) prefix matched.
func (d *Directory) ByKey(key []byte) *Tenant {
	sum := sha256.Sum256(key)
	var found *Tenant
	list := d.List()
	for i := range list {
		if subtle.ConstantTimeCompare(sum[:], list[i].Hash) == 1 {
			found = &list[i]
		}
	}
	return found
}

// Config is the config file's tenants.
func (d *Directory) Config() []Tenant { return *d.base.Load() }

// SetBase replaces the config file's tenants (a reload) and rebuilds the list with the run-time
// ones at once. Requests already admitted keep the tenant they were admitted as.
func (d *Directory) SetBase(base []Tenant) {
	d.syncMu.Lock()
	d.base.Store(&base)
	d.synced = false // the next Sync rebuilds even if the store's version did not move
	d.syncMu.Unlock()
	if d.store == nil {
		list := base
		d.all.Store(&list)
		return
	}
	d.Sync(context.Background())
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	if !d.synced { // the store did not answer: the new base with the run-time tenants last seen
		list := append([]Tenant(nil), base...)
		names := map[string]bool{}
		for _, t := range base {
			names[t.Name] = true
		}
		for _, t := range *d.all.Load() {
			if d.runtime(t.Name) && !names[t.Name] {
				list = append(list, t)
			}
		}
		d.all.Store(&list)
	}
}

// runtime: name is a run-time tenant in the list now (not in the config file's last base).
func (d *Directory) runtime(name string) bool {
	for _, t := range *d.all.Load() {
		if t.Name == name {
			return t.runtime
		}
	}
	return false
}

// Configured is the config file's tenant called name, or nil.
func (d *Directory) Configured(name string) *Tenant {
	base := d.Config()
	for i := range base {
		if base[i].Name == name {
			return &base[i]
		}
	}
	return nil
}

// KeyClash says a config tenant already has the key whose hex SHA-256 is keyHex.
func (d *Directory) KeyClash(keyHex string) bool {
	for _, t := range d.Config() {
		if strings.EqualFold(hex.EncodeToString(t.Hash), keyHex) {
			return true
		}
	}
	return false
}

// Run keeps the list in sync until ctx ends.
func (d *Directory) Run(ctx context.Context) {
	t := time.NewTicker(SyncInterval)
	defer t.Stop()
	for {
		d.Sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sync reloads the run-time tenants when the store's version moved. With the store unreachable
// the last list stays in force.
func (d *Directory) Sync(ctx context.Context) {
	if d.store == nil {
		return
	}
	d.syncMu.Lock()
	defer d.syncMu.Unlock()
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := d.store.Version(c)
	if err != nil || (d.synced && v == d.version) {
		return
	}
	recs, err := d.store.List(c)
	if err != nil {
		return
	}
	d.version, d.synced = v, true
	base := d.Config()
	list := append([]Tenant(nil), base...)
	taken := map[string]bool{}
	for _, t := range base {
		taken["n:"+t.Name], taken["k:"+hex.EncodeToString(t.Hash)] = true, true
	}
	for _, r := range recs {
		key := strings.ToLower(r.KeySHA256)
		h, err := hex.DecodeString(key)
		if err != nil || len(h) != 32 || taken["n:"+r.Name] || taken["k:"+key] {
			// The admin API refuses these; one written around it must not shadow a config tenant.
			d.log.Warn("ignoring a run-time tenant that clashes with the config file or has a bad key", zap.String("tenant", r.Name))
			continue
		}
		taken["n:"+r.Name], taken["k:"+key] = true, true
		r.KeySHA256 = key
		list = append(list, Tenant{Tenant: r, Hash: h, runtime: true})
		if d.OnAdd != nil {
			d.OnAdd(r.Name)
		}
	}
	d.all.Store(&list)
}
