package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/config"
)

// TenantStore holds the tenants added at run time, as config.Tenant records (the file's tenant
// type, so every attribute a file tenant has is stored; only the key's hex SHA-256 ever is).
// Records are read with the file's defaults (SetDefaults: a record written before an attribute
// existed). Version changes on every write, so replicas
// poll one small value and reload the list only when it moved.
type TenantStore interface {
	Version(ctx context.Context) (int64, error)
	List(ctx context.Context) ([]config.Tenant, error)
	Get(ctx context.Context, name string) (config.Tenant, error)
	// Create fails with ErrTenantExists or ErrKeyInUse.
	Create(ctx context.Context, t config.Tenant) error
	// Update replaces t.Name's record; it fails with ErrTenantNotFound or ErrKeyInUse.
	Update(ctx context.Context, t config.Tenant) error
	// Delete fails with ErrTenantNotFound.
	Delete(ctx context.Context, name string) error
}

var (
	_ TenantStore = (*MemoryTenants)(nil)
	_ TenantStore = (*RedisTenants)(nil)
)

// Errors of TenantStore writes.
var (
	ErrTenantExists   = errors.New("a tenant with this name exists")
	ErrTenantNotFound = errors.New("no such tenant")
	ErrKeyInUse       = errors.New("this key belongs to another tenant")
)

// MemoryTenants is the store for one replica (no Redis).
type MemoryTenants struct {
	mu      sync.Mutex
	version int64
	byName  map[string]config.Tenant
}

// NewMemoryTenants returns an empty store.
func NewMemoryTenants() *MemoryTenants { return &MemoryTenants{byName: map[string]config.Tenant{}} }

func (m *MemoryTenants) Version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, nil
}

func (m *MemoryTenants) List(context.Context) ([]config.Tenant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]config.Tenant, 0, len(m.byName))
	for _, t := range m.byName {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (m *MemoryTenants) Get(_ context.Context, name string) (config.Tenant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.byName[name]
	if !ok {
		return config.Tenant{}, ErrTenantNotFound
	}
	return t, nil
}

func (m *MemoryTenants) keyOwnerLocked(key string) string {
	for _, t := range m.byName {
		if t.KeySHA256 == key {
			return t.Name
		}
	}
	return ""
}

func (m *MemoryTenants) Create(_ context.Context, t config.Tenant) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byName[t.Name]; ok {
		return ErrTenantExists
	}
	if m.keyOwnerLocked(t.KeySHA256) != "" {
		return ErrKeyInUse
	}
	t.SetDefaults()
	m.byName[t.Name] = t
	m.version++
	return nil
}

func (m *MemoryTenants) Update(_ context.Context, t config.Tenant) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byName[t.Name]; !ok {
		return ErrTenantNotFound
	}
	if o := m.keyOwnerLocked(t.KeySHA256); o != "" && o != t.Name {
		return ErrKeyInUse
	}
	t.SetDefaults()
	m.byName[t.Name] = t
	m.version++
	return nil
}

func (m *MemoryTenants) Delete(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byName[name]; !ok {
		return ErrTenantNotFound
	}
	delete(m.byName, name)
	m.version++
	return nil
}

// RedisTenants keeps tenants in a hash prefix+"{kvgate}:tenants" (name → JSON record), an index
// prefix+"{kvgate}:tenant-keys" (key hash → name) so a key cannot belong to two tenants, and a
// counter prefix+"{kvgate}:tenants:version". Writes are scripts, so the three stay consistent
// when replicas write at once.
type RedisTenants struct {
	client redis.UniversalClient
	prefix string
}

// NewRedisTenants returns the store shared by every replica with the same Redis and prefix.
func NewRedisTenants(client redis.UniversalClient, prefix string) *RedisTenants {
	return &RedisTenants{client: client, prefix: prefix}
}

func (r *RedisTenants) keys() []string { return Keys{r.prefix}.Tenants() }

func (r *RedisTenants) Version(ctx context.Context) (int64, error) {
	v, err := r.client.Get(ctx, r.keys()[2]).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the tenants version: %w", err)
	}
	return v, nil
}

func (r *RedisTenants) List(ctx context.Context) ([]config.Tenant, error) {
	all, err := r.client.HGetAll(ctx, r.keys()[0]).Result()
	if err != nil {
		return nil, fmt.Errorf("reading tenants: %w", err)
	}
	out := make([]config.Tenant, 0, len(all))
	for name, raw := range all {
		t, err := decodeTenant(raw)
		if err != nil || t.Name != name {
			continue // a record this version cannot read is not a tenant it can serve
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (r *RedisTenants) Get(ctx context.Context, name string) (config.Tenant, error) {
	raw, err := r.client.HGet(ctx, r.keys()[0], name).Result()
	if errors.Is(err, redis.Nil) {
		return config.Tenant{}, ErrTenantNotFound
	}
	if err != nil {
		return config.Tenant{}, fmt.Errorf("reading tenant %q: %w", name, err)
	}
	t, err := decodeTenant(raw)
	if err != nil {
		return config.Tenant{}, fmt.Errorf("tenant %q: %w", name, err)
	}
	return t, nil
}

// decodeTenant reads a stored record, with the file's defaults for what it lacks.
func decodeTenant(raw string) (config.Tenant, error) {
	var t config.Tenant
	if err := json.Unmarshal([]byte(raw), &t); err != nil {
		return config.Tenant{}, err
	}
	t.SetDefaults()
	return t, nil
}

// putScript: KEYS tenants, key index, version; ARGV mode (create|update), name, key hash, JSON.
var putScript = redis.NewScript(`
local exists = redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1
if ARGV[1] == 'create' and exists then return 'exists' end
if ARGV[1] == 'update' and not exists then return 'not_found' end
local owner = redis.call('HGET', KEYS[2], ARGV[3])
if owner and owner ~= ARGV[2] then return 'key_in_use' end
if exists then
  local old = cjson.decode(redis.call('HGET', KEYS[1], ARGV[2]))
  if old.key_sha256 and old.key_sha256 ~= ARGV[3] then redis.call('HDEL', KEYS[2], old.key_sha256) end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[2])
redis.call('INCR', KEYS[3])
return 'ok'`)

// deleteScript: KEYS as putScript; ARGV name.
var deleteScript = redis.NewScript(`
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 'not_found' end
local old = cjson.decode(raw)
if old.key_sha256 then redis.call('HDEL', KEYS[2], old.key_sha256) end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[3])
return 'ok'`)

func (r *RedisTenants) put(ctx context.Context, mode string, t config.Tenant) error {
	raw, _ := json.Marshal(t)
	res, err := putScript.Run(ctx, r.client, r.keys(), mode, t.Name, t.KeySHA256, string(raw)).Text()
	if err != nil {
		return fmt.Errorf("writing tenant %q: %w", t.Name, err)
	}
	return scriptResult(res)
}

func scriptResult(res string) error {
	switch res {
	case "ok":
		return nil
	case "exists":
		return ErrTenantExists
	case "not_found":
		return ErrTenantNotFound
	case "key_in_use":
		return ErrKeyInUse
	}
	return fmt.Errorf("tenant store: unexpected reply %q", res)
}

func (r *RedisTenants) Create(ctx context.Context, t config.Tenant) error {
	return r.put(ctx, "create", t)
}

func (r *RedisTenants) Update(ctx context.Context, t config.Tenant) error {
	return r.put(ctx, "update", t)
}

func (r *RedisTenants) Delete(ctx context.Context, name string) error {
	res, err := deleteScript.Run(ctx, r.client, r.keys(), name).Text()
	if err != nil {
		return fmt.Errorf("deleting tenant %q: %w", name, err)
	}
	return scriptResult(res)
}
