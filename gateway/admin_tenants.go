package gateway

// The admin API for tenants added at run time: POST /admin/tenants, GET /admin/tenants,
// PATCH and DELETE /admin/tenants/{name}. Records live in the tenant store (Redis, or memory for
// one replica); every replica picks changes up within tenantSyncInterval. Tenants from the config
// file are the base set: listed here, but changed only in the file. Keys are only ever taken
// and stored as their SHA-256.

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/state"
)

// adminTenants serves the tenant routes; false means path is not one of them.
func (g *Gateway) adminTenants(ctx *fasthttp.RequestCtx, path, method string) bool {
	if path == "/admin/tenants" {
		switch method {
		case fasthttp.MethodGet:
			if g.adminAuth(ctx) {
				g.listTenants(ctx)
			}
		case fasthttp.MethodPost:
			if g.adminAuth(ctx) {
				g.createTenant(ctx)
			}
		default:
			writeError(ctx, apierr.Method)
		}
		return true
	}
	name, ok := strings.CutPrefix(path, "/admin/tenants/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return false
	}
	switch method {
	case fasthttp.MethodPatch:
		if g.adminAuth(ctx) {
			g.patchTenant(ctx, name)
		}
	case fasthttp.MethodDelete:
		if g.adminAuth(ctx) {
			g.deleteTenant(ctx, name)
		}
	default:
		writeError(ctx, apierr.Method)
	}
	return true
}

// tenantFields is a POST or PATCH body; nil fields are absent (PATCH keeps them).
type tenantFields struct {
	Name            *string `json:"name"`
	KeySHA256       *string `json:"key_sha256"`
	MaxPromptTokens *int    `json:"max_prompt_tokens"`
	CanaryOptOut    *bool   `json:"canary_opt_out"`
	RPM             *int    `json:"rpm"`
	TPM             *int    `json:"tpm"`
	MaxConcurrent   *int    `json:"max_concurrent"`
}

// readTenantFields reads the body through readBody: the server streams request bodies, so
// PostBody alone may not hold all of it.
func readTenantFields(ctx *fasthttp.RequestCtx) (*tenantFields, *apierr.Error) {
	body, e := readBody(ctx, 1<<20)
	if e != nil {
		return nil, e
	}
	return decodeTenantFields(body)
}

func decodeTenantFields(body []byte) (*tenantFields, *apierr.Error) {
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) == nil {
		for _, k := range []string{"key", "api_key"} {
			if _, ok := probe[k]; ok {
				return nil, apierr.BadRequest(k, "Send 'key_sha256', the hex SHA-256 of the key (printf %s KEY | sha256sum); kvgate never accepts or stores a key itself.")
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var f tenantFields
	if err := dec.Decode(&f); err != nil {
		return nil, apierr.BadRequest("", "Invalid tenant JSON: "+err.Error())
	}
	return &f, nil
}

func validTenantName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// apply merges f into r and validates the result.
func (f *tenantFields) apply(r *state.TenantRecord) *apierr.Error {
	if f.KeySHA256 != nil {
		r.KeySHA256 = strings.ToLower(*f.KeySHA256)
	}
	if h, err := hex.DecodeString(r.KeySHA256); err != nil || len(h) != 32 {
		return apierr.BadRequest("key_sha256", "'key_sha256' must be 64 hex characters (the SHA-256 of the tenant's API key).")
	}
	for _, v := range []struct {
		name string
		src  *int
		dst  *int
	}{{"max_prompt_tokens", f.MaxPromptTokens, &r.MaxPromptTokens}, {"rpm", f.RPM, &r.RPM}, {"tpm", f.TPM, &r.TPM},
		{"max_concurrent", f.MaxConcurrent, &r.MaxConcurrent}} {
		if v.src == nil {
			continue
		}
		if *v.src < 0 {
			return apierr.BadRequest(v.name, fmt.Sprintf("'%s' must be ≥ 0 (0 = no limit).", v.name))
		}
		*v.dst = *v.src
	}
	if f.CanaryOptOut != nil {
		r.CanaryOptOut = *f.CanaryOptOut
	}
	return nil
}

func storeError(err error, name string) *apierr.Error {
	switch {
	case errors.Is(err, state.ErrTenantExists):
		return &apierr.Error{Status: 409, Type: "invalid_request_error", Code: "tenant_exists", Param: "name",
			Message: fmt.Sprintf("A tenant named %q exists.", name)}
	case errors.Is(err, state.ErrKeyInUse):
		return keyInUse()
	case errors.Is(err, state.ErrTenantNotFound):
		return tenantNotFound(name)
	}
	return &apierr.Error{Status: 503, Type: "server_error", Code: "state_unavailable", RetryAfter: 5,
		Message: "The tenant store is unreachable; nothing was changed: " + err.Error()}
}

func keyInUse() *apierr.Error {
	return &apierr.Error{Status: 409, Type: "invalid_request_error", Code: "key_in_use", Param: "key_sha256",
		Message: "This key belongs to another tenant."}
}

func tenantNotFound(name string) *apierr.Error {
	return &apierr.Error{Status: 404, Type: "invalid_request_error", Code: "not_found", Param: "tenant",
		Message: fmt.Sprintf("No run-time tenant named %q.", name)}
}

func configTenantError(name string) *apierr.Error {
	return &apierr.Error{Status: 409, Type: "invalid_request_error", Code: "config_tenant", Param: "tenant",
		Message: fmt.Sprintf("Tenant %q is defined in the config file; change it there.", name)}
}

func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 3*time.Second)
}

// tenantView is one row of GET /admin/tenants; the key hash is shown by its first 8 characters.
type tenantView struct {
	Name            string `json:"name"`
	Source          string `json:"source"`
	KeyPrefix       string `json:"key_sha256_prefix"`
	MaxPromptTokens int    `json:"max_prompt_tokens"`
	CanaryOptOut    bool   `json:"canary_opt_out"`
	policy.Limits
}

func viewOf(r state.TenantRecord, source string) tenantView {
	return tenantView{Name: r.Name, Source: source, KeyPrefix: r.KeySHA256[:min(8, len(r.KeySHA256))],
		MaxPromptTokens: r.MaxPromptTokens, CanaryOptOut: r.CanaryOptOut, Limits: r.Limits}
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, _ := json.Marshal(v)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

func (g *Gateway) listTenants(ctx *fasthttp.RequestCtx) {
	out := []tenantView{}
	for _, t := range g.tenants.Config() {
		out = append(out, viewOf(state.TenantRecord{Name: t.Name, KeySHA256: t.KeySHA256, MaxPromptTokens: t.MaxPromptTokens,
			CanaryOptOut: t.CanaryOptOut, Limits: t.Limits()}, "config"))
	}
	rctx, cancel := storeCtx()
	defer cancel()
	recs, err := g.lim.store.List(rctx)
	if err != nil {
		writeError(ctx, storeError(err, ""))
		return
	}
	for _, r := range recs {
		out = append(out, viewOf(r, "runtime"))
	}
	writeJSON(ctx, 200, map[string]any{"tenants": out})
}

func (g *Gateway) createTenant(ctx *fasthttp.RequestCtx) {
	f, e := readTenantFields(ctx)
	if e != nil {
		writeError(ctx, e)
		return
	}
	if f.Name == nil || !validTenantName(*f.Name) {
		writeError(ctx, apierr.BadRequest("name", "'name' is required: 1 to 64 characters from A-Z, a-z, 0-9, '-', '_', '.'."))
		return
	}
	if f.KeySHA256 == nil {
		writeError(ctx, apierr.BadRequest("key_sha256", "'key_sha256' is required (the hex SHA-256 of the tenant's API key)."))
		return
	}
	r := state.TenantRecord{Name: *f.Name}
	if e := f.apply(&r); e != nil {
		writeError(ctx, e)
		return
	}
	if g.tenants.Configured(r.Name) != nil {
		writeError(ctx, storeError(state.ErrTenantExists, r.Name))
		return
	}
	if g.tenants.KeyClash(r.KeySHA256) {
		writeError(ctx, keyInUse())
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.lim.store.Create(rctx, r); err != nil {
		writeError(ctx, storeError(err, r.Name))
		return
	}
	g.tenants.Sync(rctx) // this replica serves the tenant at once; others within a sync interval
	g.log.Info("tenant created by an operator", zap.String("tenant", r.Name))
	writeJSON(ctx, 201, viewOf(r, "runtime"))
}

func (g *Gateway) patchTenant(ctx *fasthttp.RequestCtx, name string) {
	if g.tenants.Configured(name) != nil {
		writeError(ctx, configTenantError(name))
		return
	}
	f, e := readTenantFields(ctx)
	if e != nil {
		writeError(ctx, e)
		return
	}
	if f.Name != nil && *f.Name != name {
		writeError(ctx, apierr.BadRequest("name", "A tenant cannot be renamed: create the new name and delete the old one."))
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	r, err := g.lim.store.Get(rctx, name)
	if err != nil {
		writeError(ctx, storeError(err, name))
		return
	}
	if e := f.apply(&r); e != nil {
		writeError(ctx, e)
		return
	}
	if g.tenants.KeyClash(r.KeySHA256) {
		writeError(ctx, keyInUse())
		return
	}
	if err := g.lim.store.Update(rctx, r); err != nil {
		writeError(ctx, storeError(err, name))
		return
	}
	g.tenants.Sync(rctx)
	g.log.Info("tenant changed by an operator", zap.String("tenant", name))
	writeJSON(ctx, 200, viewOf(r, "runtime"))
}

func (g *Gateway) deleteTenant(ctx *fasthttp.RequestCtx, name string) {
	if g.tenants.Configured(name) != nil {
		writeError(ctx, configTenantError(name))
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.lim.store.Delete(rctx, name); err != nil {
		writeError(ctx, storeError(err, name))
		return
	}
	g.tenants.Sync(rctx)
	g.log.Warn("tenant deleted by an operator", zap.String("tenant", name))
	writeJSON(ctx, 200, map[string]any{"deleted": name})
}
