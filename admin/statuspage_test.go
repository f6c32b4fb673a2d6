package admin_test

// The status page's login, session and CSRF rules over plain HTTP against a real gateway (the
// browser test in admin/ui covers the page itself).

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admin/ui"
	"github.com/kvgate/kvgate/tests/testkit"
)

// noRedirect is a client that hands back the 303s the login answers with.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func do(t *testing.T, method, u string, body io.Reader, h map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, u, body)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func login(t *testing.T, base, key string) *http.Response {
	return do(t, "POST", base+"/admin/ui/login", strings.NewReader(url.Values{"key": {key}}.Encode()),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
}

func TestStatusPageSessions(t *testing.T) {
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf(
		"backends: [{name: x, url: \"http://127.0.0.1:9\", role: unified}]\nadmin_key_sha256: %q\n", testkit.KeySHA256("the-admin-key"))))

	for _, key := range []string{"", "wrong", "the-admin-key-and-more", testkit.KeySHA256("the-admin-key")} {
		r := login(t, gw.URL, key)
		if r.StatusCode != 303 || !strings.HasSuffix(r.Header.Get("Location"), "/admin/ui/?login=failed") || len(r.Cookies()) != 0 {
			t.Fatalf("login with %q: %d %v %v", key, r.StatusCode, r.Header.Get("Location"), r.Cookies())
		}
	}
	if r := do(t, "GET", gw.URL+"/admin/ui/login", nil, nil); r.StatusCode != 405 {
		t.Fatalf("GET login: %d", r.StatusCode)
	}

	r := login(t, gw.URL, "the-admin-key")
	var c *http.Cookie
	for _, k := range r.Cookies() {
		if k.Name == ui.CookieName {
			c = k
		}
	}
	if r.StatusCode != 303 || !strings.HasSuffix(r.Header.Get("Location"), "/admin/ui/") || c == nil ||
		!c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/admin/" || c.Secure || len(c.Value) != 64 {
		t.Fatalf("login: %d %s %+v", r.StatusCode, r.Header.Get("Location"), c)
	}
	cookie := map[string]string{"Cookie": ui.CookieName + "=" + c.Value}

	// The session reads what the admin key reads, and tells the page its CSRF token.
	for _, p := range []string{"/admin/backends", "/admin/incidents", "/admin/tenants", "/admin/stats"} {
		if r := do(t, "GET", gw.URL+p, nil, cookie); r.StatusCode != 200 {
			t.Fatalf("GET %s with the session: %d", p, r.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", gw.URL+"/admin/ui/session", nil)
	req.AddCookie(c)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		CSRF string `json:"csrf_token"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(sess.CSRF) != 64 || sess.CSRF == c.Value {
		t.Fatalf("session: %d %+v", resp.StatusCode, sess)
	}

	// Changes need the token; a bearer key needs none; a forged cookie is no session.
	quarantine := gw.URL + "/admin/backends/x/quarantine"
	if r := do(t, "POST", quarantine, nil, cookie); r.StatusCode != 403 {
		t.Fatalf("quarantine with the cookie alone: %d, want 403", r.StatusCode)
	}
	withToken := map[string]string{"Cookie": cookie["Cookie"], ui.CSRFHeader: sess.CSRF}
	if r := do(t, "POST", quarantine, nil, withToken); r.StatusCode != 200 {
		t.Fatalf("quarantine with the cookie and its token: %d", r.StatusCode)
	}
	if r := do(t, "POST", gw.URL+"/admin/backends/x/release", nil, map[string]string{"Authorization": "Bearer the-admin-key"}); r.StatusCode != 200 {
		t.Fatalf("release with the bearer key: %d", r.StatusCode)
	}
	forged := map[string]string{"Cookie": ui.CookieName + "=" + strings.Repeat("a", 64)}
	if r := do(t, "GET", gw.URL+"/admin/backends", nil, forged); r.StatusCode != 401 {
		t.Fatalf("a forged session id: %d", r.StatusCode)
	}

	// Sign-out needs the token too, then the session is gone.
	if r := do(t, "POST", gw.URL+"/admin/ui/logout", nil, cookie); r.StatusCode != 403 {
		t.Fatalf("logout without the token: %d", r.StatusCode)
	}
	if r := do(t, "POST", gw.URL+"/admin/ui/logout", nil, withToken); r.StatusCode != 200 {
		t.Fatalf("logout: %d", r.StatusCode)
	}
	if r := do(t, "GET", gw.URL+"/admin/backends", nil, cookie); r.StatusCode != 401 {
		t.Fatalf("after logout: %d", r.StatusCode)
	}
}

// Behind a proxy that terminated TLS (X-Forwarded-Proto: https) the cookie is Secure.
func TestStatusPageCookieSecureBehindTLSProxy(t *testing.T) {
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf(
		"backends: [{name: x, url: \"http://127.0.0.1:9\", role: unified}]\nadmin_key_sha256: %q\n", testkit.KeySHA256("k"))))
	r := do(t, "POST", gw.URL+"/admin/ui/login", strings.NewReader("key=k"),
		map[string]string{"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-Proto": "https"})
	if cs := r.Cookies(); len(cs) != 1 || !cs[0].Secure || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie behind a TLS proxy: %+v", cs)
	}
}

// Without an admin key configured nothing opens a session.
func TestStatusPageWithoutAdminKey(t *testing.T) {
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, "backends: [{name: x, url: \"http://127.0.0.1:9\", role: unified}]\n"))
	if r := login(t, gw.URL, ""); r.StatusCode != 303 || len(r.Cookies()) != 0 || !strings.Contains(r.Header.Get("Location"), "failed") {
		t.Fatalf("login without a configured key: %d %v", r.StatusCode, r.Cookies())
	}
	if r := do(t, "GET", gw.URL+"/admin/ui/", nil, nil); r.StatusCode != 200 {
		t.Fatalf("the page itself: %d", r.StatusCode)
	}
}
