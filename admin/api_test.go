package admin_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
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
	"github.com/kvgate/kvgate/tests/redistest"
	"github.com/kvgate/kvgate/tests/tenantcase"
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

// GET /admin/tenants/{name} answers one tenant (file or run time) or 404.
func TestAdminGetOneTenant(t *testing.T) {
	a := api(t, "admin-key")
	a.Tenants = tenants.NewDirectory(tenants.FromConfig([]config.Tenant{{Name: "alice", KeySHA256: config.SHA256Hex("ka"), RPM: 5}}), a.Store, zap.NewNop())
	if _, status, body := call(a, "POST", "/admin/tenants", "admin-key", `{"name":"carol","key_sha256":"`+config.SHA256Hex("kc")+`","tpm":700}`); status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	for _, c := range []struct {
		name, source string
		rpm, tpm     float64
	}{{"alice", "config", 5, 0}, {"carol", "runtime", 0, 700}} {
		_, status, body := call(a, "GET", "/admin/tenants/"+c.name, "admin-key", "")
		var v map[string]any
		if status != 200 || json.Unmarshal(body, &v) != nil || v["name"] != c.name || v["source"] != c.source || v["rpm"] != c.rpm || v["tpm"] != c.tpm {
			t.Fatalf("GET %s: %d %s", c.name, status, body)
		}
		if strings.Contains(string(body), config.SHA256Hex("kc")) || strings.Contains(string(body), config.SHA256Hex("ka")) {
			t.Fatalf("GET %s shows the whole key hash: %s", c.name, body)
		}
	}
	if _, status, body := call(a, "GET", "/admin/tenants/nobody", "admin-key", ""); status != 404 {
		t.Fatalf("an unknown tenant: %d %s", status, body)
	}
	if _, status, _ := call(a, "GET", "/admin/tenants/alice", "wrong-key", ""); status != 401 {
		t.Fatalf("without the admin key: %d", status)
	}
}

// ?since= and ?tenant= filter incidents (memory and Redis logs alike); a bad value is a 400 naming
// the parameter.
func TestAdminIncidentFilters(t *testing.T) {
	client, prefix := redistest.Open(t)
	for name, log := range map[string]state.IncidentLog{
		"memory": state.NewMemoryIncidents(100),
		"redis":  state.NewRedisIncidents(client, prefix, 100, 100),
	} {
		t.Run(name, func(t *testing.T) {
			a := api(t, "admin-key")
			a.Incidents = log
			base := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
			for i, inc := range []state.Incident{
				{Kind: state.KindLeak, RequestID: "r0", Victim: "alice", Requester: "bob"},
				{Kind: state.KindEcho, RequestID: "r1", Victim: "carol", Requester: "bob"},
				{Kind: state.KindLeak, RequestID: "r2", Victim: "carol", Requester: "dave"},
				{Kind: state.KindLeak, RequestID: "r3", Victim: "alice", Requester: "erin"},
			} {
				inc.Time = base.Add(time.Duration(i) * time.Hour)
				if err := log.Record(context.Background(), inc); err != nil {
					t.Fatal(err)
				}
			}
			ids := func(query string) string {
				t.Helper()
				_, status, body := call(a, "GET", "/admin/incidents"+query, "admin-key", "")
				var out struct{ Incidents []state.Incident }
				if status != 200 || json.Unmarshal(body, &out) != nil {
					t.Fatalf("%s: %d %s", query, status, body)
				}
				var got []string
				for _, inc := range out.Incidents {
					got = append(got, inc.RequestID)
				}
				return strings.Join(got, ",")
			}
			for query, want := range map[string]string{
				"":                            "r3,r2,r1,r0",
				"?tenant=carol":               "r2,r1",
				"?tenant=bob":                 "r1,r0",
				"?since=2026-12-03T13:30:00Z": "r3,r2",
				"?since=" + fmt.Sprint(base.Add(time.Hour).UnixMilli()): "r3,r2,r1",
				"?since=2026-12-03T13:00:00Z&tenant=alice":              "r3",
				"?tenant=alice&limit=1":                                 "r3",
				"?tenant=nobody":                                        "",
			} {
				if got := ids(query); got != want {
					t.Errorf("incidents%s: %q, want %q", query, got, want)
				}
			}
			for query, param := range map[string]string{"?since=yesterday": "since", "?since=2026-13-03": "since", "?tenant=": "tenant", "?limit=x": "limit"} {
				_, status, body := call(a, "GET", "/admin/incidents"+query, "admin-key", "")
				if status != 400 || !strings.Contains(string(body), `"param":"`+param+`"`) {
					t.Errorf("incidents%s: %d %s, want 400 naming %s", query, status, body, param)
				}
			}
		})
	}
}

// Every attribute a file tenant has can be set through the admin API, is served by the directory
// and read back by GET (the file's tenants are shown the same way); PATCH changes one and keeps
// the rest; a bad value is a 400 naming its field.
func TestAdminTenantEveryAttribute(t *testing.T) {
	a := api(t, "admin-key")
	file := tenantcase.Full("filed", "k-file")
	a.Tenants = tenants.NewDirectory(tenants.FromConfig([]config.Tenant{file}), a.Store, zap.NewNop())
	full := tenantcase.Full("full", "k-full")
	body, _ := json.Marshal(full)
	if _, status, out := call(a, "POST", "/admin/tenants", "admin-key", string(body)); status != 201 {
		t.Fatalf("create: %d %s", status, out)
	}
	if got := a.Tenants.ByKey([]byte("k-full")); got == nil || got.Tenant != full {
		t.Fatalf("directory: %+v, want %+v", got, full)
	}
	for _, c := range []struct {
		want   config.Tenant
		source string
	}{{full, "runtime"}, {file, "config"}} {
		_, status, out := call(a, "GET", "/admin/tenants/"+c.want.Name, "admin-key", "")
		var got config.Tenant
		if status != 200 || json.Unmarshal(out, &got) != nil {
			t.Fatalf("GET %s: %d %s", c.want.Name, status, out)
		}
		got.KeySHA256 = c.want.KeySHA256 // shown by its prefix only
		if got != c.want || !strings.Contains(string(out), `"source":"`+c.source+`"`) {
			t.Fatalf("GET %s = %s, want %+v", c.want.Name, out, c.want)
		}
	}
	if _, status, out := call(a, "PATCH", "/admin/tenants/full", "admin-key", `{"weight":2}`); status != 200 {
		t.Fatalf("patch: %d %s", status, out)
	}
	patched := full
	patched.Weight = 2
	if got := a.Tenants.ByKey([]byte("k-full")); got == nil || got.Tenant != patched {
		t.Fatalf("after PATCH weight: %+v, want %+v", got, patched)
	}
	for body, param := range map[string]string{`{"weight":1000.5}`: "weight", `{"weight":-2}`: "weight", `{"rpm":"x"}`: "rpm", `{"tpm":-1}`: "tpm"} {
		_, status, out := call(a, "PATCH", "/admin/tenants/full", "admin-key", body)
		var e struct {
			Error struct{ Param string }
		}
		if status != 400 || json.Unmarshal(out, &e) != nil || e.Error.Param != param {
			t.Errorf("PATCH %s: %d %s, want a 400 naming %q", body, status, out, param)
		}
	}
}
