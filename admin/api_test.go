package admin_test

import (
	"crypto/sha256"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/admin"
	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
)

func api(t *testing.T, key string) *admin.API {
	t.Helper()
	set, err := backends.New([]config.Backend{{Name: "b1", URL: "http://127.0.0.1:1", Role: config.RoleUnified}}, backends.Options{PollInterval: time.Second, MaxAge: time.Second, PollTimeout: time.Second, ConnectTimeout: time.Second, ResponseHeaderTimeout: time.Second, IdleTimeout: time.Second, MaxConns: 1}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(&config.Config{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	a := &admin.API{Backends: set, Incidents: st.Incidents, Quarantines: state.NewQuarantines(st.Quarantine, set.SetQuarantine),
		Tenants: tenants.NewDirectory(nil, st.Tenants, zap.NewNop()), Store: st.Tenants, Log: zap.NewNop(),
		Bearer: func(ctx *fasthttp.RequestCtx) ([]byte, bool) {
			k, ok := strings.CutPrefix(string(ctx.Request.Header.Peek("Authorization")), "Bearer ")
			return []byte(k), ok
		},
		ReadBody: func(ctx *fasthttp.RequestCtx, n int) ([]byte, *apierr.Error) { return ctx.PostBody(), nil }}
	if key != "" {
		sum := sha256.Sum256([]byte(key))
		a.Key = sum[:]
	}
	return a
}

func call(a *admin.API, method, path, key, body string) (bool, int, []byte) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(path)
	if key != "" {
		ctx.Request.Header.Set("Authorization", "Bearer "+key)
	}
	ctx.Request.SetBodyString(body)
	ok := a.Handle(&ctx, string(ctx.Path()), method)
	return ok, ctx.Response.StatusCode(), ctx.Response.Body()
}

// Every admin route needs the key (none configured: every route is 401); a wrong method is 405;
// paths that are not admin routes are left to the caller.
func TestAdminAuthRoutesAndMethods(t *testing.T) {
	a := api(t, "admin-key")
	for _, c := range []struct {
		method, path, key string
		handled           bool
		status            int
	}{
		{"GET", "/admin/backends", "", true, 401},
		{"GET", "/admin/backends", "wrong", true, 401},
		{"GET", "/admin/backends", "admin-key", true, 200},
		{"POST", "/admin/backends", "admin-key", true, 405},
		{"GET", "/admin/incidents", "admin-key", true, 200},
		{"GET", "/admin/incidents?limit=0", "admin-key", true, 400},
		{"POST", "/admin/backends/nope/release", "admin-key", true, 404},
		{"POST", "/admin/backends/b1/release", "admin-key", true, 200},
		{"GET", "/admin/tenants", "admin-key", true, 200},
		{"PUT", "/admin/tenants", "admin-key", true, 405},
		{"GET", "/admin/unknown", "admin-key", false, 200},
	} {
		handled, status, body := call(a, c.method, c.path, c.key, "")
		if handled != c.handled || handled && status != c.status {
			t.Errorf("%s %s (key %q): handled %v status %d %s; want %v %d", c.method, c.path, c.key, handled, status, body, c.handled, c.status)
		}
	}
	if _, status, _ := call(api(t, ""), "GET", "/admin/backends", "anything", ""); status != 401 {
		t.Fatalf("no admin key configured: %d", status)
	}
	_, _, body := call(a, "GET", "/admin/backends", "admin-key", "")
	var out struct {
		Backends []struct {
			Name   string `json:"name"`
			Usable bool   `json:"usable"`
		} `json:"backends"`
	}
	if err := json.Unmarshal(body, &out); err != nil || len(out.Backends) != 1 || out.Backends[0].Name != "b1" || out.Backends[0].Usable {
		t.Fatalf("backends: %s", body)
	}
	// A tenant created here is served by the directory at once.
	_, status, body := call(a, "POST", "/admin/tenants", "admin-key", `{"name":"carol","key_sha256":"`+config.SHA256Hex("kc")+`","rpm":3}`)
	if status != 201 && status != 200 {
		t.Fatalf("create: %d %s", status, body)
	}
	if c := a.Tenants.ByKey([]byte("kc")); c == nil || c.RPM != 3 {
		t.Fatalf("created tenant not in the directory: %+v", c)
	}
}
