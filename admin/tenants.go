package admin

// The admin API for tenants added at run time: POST /admin/tenants, GET /admin/tenants,
// GET, PATCH and DELETE /admin/tenants/{name}. Records live in the tenant store (Redis, or memory for
// one replica); every replica picks changes up within tenants.SyncInterval. Tenants from the config
// file are the base set: listed here, but changed only in the file. Keys are only ever taken
// and stored as their SHA-256.

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/apierr/respond"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
)

// tenants serves the tenant routes; false means path is not one of them.
func (g *API) tenants(ctx *fasthttp.RequestCtx, path, method string) bool {
	if path == "/admin/tenants" {
		switch method {
		case fasthttp.MethodGet:
			if g.Auth(ctx) {
				g.listTenants(ctx)
			}
		case fasthttp.MethodPost:
			if g.Auth(ctx) {
				g.createTenant(ctx)
			}
		default:
			respond.Error(ctx, apierr.Method, apierr.OpenAI)
		}
		return true
	}
	name, ok := strings.CutPrefix(path, "/admin/tenants/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return false
	}
	switch method {
	case fasthttp.MethodGet:
		if g.Auth(ctx) {
			g.getTenant(ctx, name)
		}
	case fasthttp.MethodPatch:
		if g.Auth(ctx) {
			g.patchTenant(ctx, name)
		}
	case fasthttp.MethodDelete:
		if g.Auth(ctx) {
			g.deleteTenant(ctx, name)
		}
	default:
		respond.Error(ctx, apierr.Method, apierr.OpenAI)
	}
	return true
}

// readTenant merges the body into r (tenants.Decode), read through ReadBody: the server streams
// request bodies, so PostBody alone may not hold all of it.
func (g *API) readTenant(ctx *fasthttp.RequestCtx, r *config.Tenant) *apierr.Error {
	body, e := g.ReadBody(ctx, 1<<20)
	if e != nil {
		return e
	}
	return tenants.Decode(body, r)
}

func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 3*time.Second)
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, _ := json.Marshal(v)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// configView shows a tenant of the config file as the store's tenants are shown.
func configView(t tenants.Tenant) tenants.View { return tenants.ViewOf(t.Tenant, "config") }

func (g *API) listTenants(ctx *fasthttp.RequestCtx) {
	out := []tenants.View{}
	for _, t := range g.Tenants.Config() {
		out = append(out, configView(t))
	}
	rctx, cancel := storeCtx()
	defer cancel()
	recs, err := g.Store.List(rctx)
	if err != nil {
		respond.Error(ctx, tenants.StoreError(err, ""), apierr.OpenAI)
		return
	}
	for _, r := range recs {
		out = append(out, tenants.ViewOf(r, "runtime"))
	}
	writeJSON(ctx, 200, map[string]any{"tenants": out})
}

// getTenant answers one tenant as listTenants shows it: from the config file, or the store.
func (g *API) getTenant(ctx *fasthttp.RequestCtx, name string) {
	if t := g.Tenants.Configured(name); t != nil {
		writeJSON(ctx, 200, configView(*t))
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	r, err := g.Store.Get(rctx, name)
	if err != nil {
		respond.Error(ctx, tenants.StoreError(err, name), apierr.OpenAI)
		return
	}
	writeJSON(ctx, 200, tenants.ViewOf(r, "runtime"))
}

func (g *API) createTenant(ctx *fasthttp.RequestCtx) {
	var r config.Tenant
	if e := g.readTenant(ctx, &r); e != nil {
		respond.Error(ctx, e, apierr.OpenAI)
		return
	}
	if !tenants.ValidName(r.Name) {
		respond.Error(ctx, apierr.BadRequest("name", "'name' is required: 1 to 64 characters from A-Z, a-z, 0-9, '-', '_', '.'."), apierr.OpenAI)
		return
	}
	if e := tenants.Validate(&r); e != nil {
		respond.Error(ctx, e, apierr.OpenAI)
		return
	}
	if g.Tenants.Configured(r.Name) != nil {
		respond.Error(ctx, tenants.StoreError(state.ErrTenantExists, r.Name), apierr.OpenAI)
		return
	}
	if g.Tenants.KeyClash(r.KeySHA256) {
		respond.Error(ctx, tenants.KeyInUse(), apierr.OpenAI)
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.Store.Create(rctx, r); err != nil {
		respond.Error(ctx, tenants.StoreError(err, r.Name), apierr.OpenAI)
		return
	}
	g.Tenants.Sync(rctx) // this replica serves the tenant at once; others within a sync interval
	g.Log.Info("tenant created by an operator", zap.String("tenant", r.Name))
	writeJSON(ctx, 201, tenants.ViewOf(r, "runtime"))
}

func (g *API) patchTenant(ctx *fasthttp.RequestCtx, name string) {
	if g.Tenants.Configured(name) != nil {
		respond.Error(ctx, tenants.ConfigTenantError(name), apierr.OpenAI)
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	r, err := g.Store.Get(rctx, name)
	if err != nil {
		respond.Error(ctx, tenants.StoreError(err, name), apierr.OpenAI)
		return
	}
	if e := g.readTenant(ctx, &r); e != nil {
		respond.Error(ctx, e, apierr.OpenAI)
		return
	}
	if r.Name != name {
		respond.Error(ctx, apierr.BadRequest("name", "A tenant cannot be renamed: create the new name and delete the old one."), apierr.OpenAI)
		return
	}
	if e := tenants.Validate(&r); e != nil {
		respond.Error(ctx, e, apierr.OpenAI)
		return
	}
	if g.Tenants.KeyClash(r.KeySHA256) {
		respond.Error(ctx, tenants.KeyInUse(), apierr.OpenAI)
		return
	}
	if err := g.Store.Update(rctx, r); err != nil {
		respond.Error(ctx, tenants.StoreError(err, name), apierr.OpenAI)
		return
	}
	g.Tenants.Sync(rctx)
	g.Log.Info("tenant changed by an operator", zap.String("tenant", name))
	writeJSON(ctx, 200, tenants.ViewOf(r, "runtime"))
}

func (g *API) deleteTenant(ctx *fasthttp.RequestCtx, name string) {
	if g.Tenants.Configured(name) != nil {
		respond.Error(ctx, tenants.ConfigTenantError(name), apierr.OpenAI)
		return
	}
	rctx, cancel := storeCtx()
	defer cancel()
	if err := g.Store.Delete(rctx, name); err != nil {
		respond.Error(ctx, tenants.StoreError(err, name), apierr.OpenAI)
		return
	}
	g.Tenants.Sync(rctx)
	g.Log.Warn("tenant deleted by an operator", zap.String("tenant", name))
	writeJSON(ctx, 200, map[string]any{"deleted": name})
}
