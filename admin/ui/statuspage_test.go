package ui_test

// The status page in a real browser: Debian's chromium, headless, driven by chromedp against a
// real gateway that has just cut a leak between two simulator processes.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/kvgate/kvgate/admin/ui"
	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// chromiumPath finds Debian's chromium. CI installs it (.ci/run), so there its absence fails
// the test; a developer without it is told how to get it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed; .ci/run installs it (apt-get install -y chromium)")
	}
	t.Skip("chromium is not installed (apt-get install -y chromium): the status page's browser test did not run")
	return ""
}

// browser starts headless chromium with the flags known to work on these machines (no
// background networking: the machine's network is closed) and a fresh profile.
func browser(t *testing.T) context.Context {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	return ctx
}

// text is the text of the first element matching the CSS selector.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("%s: %v", sel, err)
	}
	return s
}

// backendRow is what /admin/backends says about one backend, to compare with the page.
type backendRow struct {
	Name     string `json:"name"`
	Capacity *struct {
		Pool    int `json:"max_total_num_tokens"`
		MRIL    int `json:"max_req_input_len"`
		Context int `json:"max_model_len"`
	} `json:"capacity"`
	PoolAlarm        bool    `json:"pool_alarm"`
	QuarantinedUntil *string `json:"quarantined_until"`
}

func adminGet(t *testing.T, url, bearer, cookie string, v any) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: cookie})
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil && resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

func adminPost(t *testing.T, url, cookie, csrf string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url, nil)
	req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: cookie})
	if csrf != "" {
		req.Header.Set(ui.CSRFHeader, csrf)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// grouped is n as the page prints it (en-US digit grouping).
func grouped(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func TestStatusPageInChromium(t *testing.T) {
	scene := testkit.StartIncidentScene(t)
	ctx := browser(t)
	page := scene.GW.URL + "/admin/ui/"

	// A wrong key: the form comes back with its error, and no session cookie is set.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(page),
		chromedp.WaitVisible(chromedp.CSS("#login form")),
		chromedp.SendKeys(chromedp.CSS("#key"), "not-the-admin-key"),
		chromedp.Submit(chromedp.CSS("#key")),
		chromedp.WaitVisible(chromedp.CSS("#login-error")),
	); err != nil {
		t.Fatalf("wrong-key login: %v", err)
	}
	loginErr := text(t, ctx, "#login-error")
	if !strings.Contains(loginErr, "not accepted") {
		t.Fatalf("login error text %q", loginErr)
	}

	// The admin key: the status sections load.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#key"), scene.AdminKey),
		chromedp.Submit(chromedp.CSS("#key")),
		chromedp.WaitVisible(chromedp.CSS(`body[data-loaded="1"]`)),
	); err != nil {
		t.Fatalf("login: %v", err)
	}

	// The cookie: HttpOnly (script cannot read it), SameSite=Strict, scoped to /admin/.
	got, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{page}})
	if err != nil {
		t.Fatal(err)
	}
	scriptCookies, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, c := range got.Cookies {
		if c.Name == ui.CookieName {
			session = c
		}
	}
	if session == nil || !session.HTTPOnly || session.SameSite != network.CookieSameSiteStrict || session.Path != "/admin/" || session.Secure {
		t.Fatalf("session cookie: %+v", session)
	}
	if strings.Contains(scriptCookies, ui.CookieName) {
		t.Fatalf("script can read the session cookie: %q", scriptCookies)
	}

	// Every backend's numbers on the page are the ones the admin API reports.
	var api struct{ Backends []backendRow }
	if adminGet(t, scene.GW.URL+"/admin/backends", scene.AdminKey, "", &api) != 200 || len(api.Backends) != 2 {
		t.Fatalf("/admin/backends: %+v", api)
	}
	for _, b := range api.Backends {
		if b.Capacity == nil {
			t.Fatalf("backend %s has no capacity reading", b.Name)
		}
		want := map[string]string{"context": grouped(b.Capacity.Context), "pool": grouped(b.Capacity.Pool),
			"max_req_input_len": grouped(b.Capacity.MRIL), "alarm": "ok", "quarantine": "quarantined until"}
		if b.PoolAlarm {
			want["alarm"] = "ALARM: pool smaller than context"
		}
		for field, wantText := range want {
			got := text(t, ctx, fmt.Sprintf(`tr[data-backend=%q] td[data-field=%q]`, b.Name, field))
			if !strings.HasPrefix(got, wantText) {
				t.Errorf("backend %s %s: page shows %q, want %q", b.Name, field, got, wantText)
			}
		}
	}
	if p0 := api.Backends[0]; p0.Name != "p0" || !p0.PoolAlarm || p0.Capacity.Pool != 4096 || p0.Capacity.Context != 16384 {
		t.Fatalf("the scene's prefill should be 4,096 under 16,384 with the alarm on: %+v", p0)
	}

	// The incidents section lists the leak; tenants show limits and use; refusals their counts.
	kind := text(t, ctx, `#incidents tbody tr td[data-field="kind"]`)
	requester := text(t, ctx, `#incidents tbody tr td[data-field="requester"]`)
	victim := text(t, ctx, `#incidents tbody tr td[data-field="victim"]`)
	rRPM := text(t, ctx, `tr[data-tenant="r"] td[data-field="rpm"]`)
	r429 := text(t, ctx, `tr[data-tenant="r"] td[data-field="refused_429"]`)
	refusals := text(t, ctx, `#refusals tbody`)
	if kind != "leak" || requester != "z" || victim == "" || !strings.Contains(scene.Victims, victim) {
		t.Errorf("incident row: kind %q requester %q victim %q", kind, requester, victim)
	}
	if rRPM != "1" || r429 != "1" {
		t.Errorf("tenant r: rpm %q, 429s %q; want 1 and 1", rRPM, r429)
	}
	if !strings.Contains(refusals, "rate_limited (429)") || !strings.Contains(refusals, "context_length_exceeded") {
		t.Errorf("refusals section: %q", refusals)
	}

	shot := filepath.Join(t.TempDir(), "status-page.png")
	if p := os.Getenv("STATUS_PAGE_SCREENSHOT"); p != "" {
		shot = p // make screenshot: docs/status-page.png
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) || len(png) < 10000 {
		t.Fatalf("screenshot: %d bytes, not a page-sized PNG", len(png))
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}

	// The session's cookie alone cannot change state: releases need the CSRF token.
	var sess struct {
		CSRF string `json:"csrf_token"`
	}
	if adminGet(t, page+"session", "", session.Value, &sess) != 200 || len(sess.CSRF) != 64 {
		t.Fatalf("session route: %+v", sess)
	}
	if code := adminPost(t, scene.GW.URL+"/admin/backends/d0/release", session.Value, ""); code != 403 {
		t.Fatalf("release with the cookie and no CSRF token: %d, want 403", code)
	}
	if code := adminPost(t, scene.GW.URL+"/admin/backends/d0/release", session.Value, strings.Repeat("0", 64)); code != 403 {
		t.Fatalf("release with a wrong CSRF token: %d, want 403", code)
	}
	var still struct{ Backends []backendRow }
	adminGet(t, scene.GW.URL+"/admin/backends", scene.AdminKey, "", &still)
	for _, b := range still.Backends {
		if b.QuarantinedUntil == nil {
			t.Fatalf("%s was released by a request without the CSRF token", b.Name)
		}
	}

	// Release from the page: p0's quarantine ends, on the page and in the API; d0's stays.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`button[data-release="p0"]`)),
		chromedp.WaitVisible(chromedp.CSS(`button[data-quarantine="p0"]`)),
	); err != nil {
		t.Fatalf("release p0: %v", err)
	}
	p0Quarantine := text(t, ctx, `tr[data-backend="p0"] td[data-field="quarantine"]`)
	var after struct{ Backends []backendRow }
	adminGet(t, scene.GW.URL+"/admin/backends", scene.AdminKey, "", &after)
	if p0Quarantine != "—" || after.Backends[0].QuarantinedUntil != nil || after.Backends[1].QuarantinedUntil == nil {
		t.Fatalf("after releasing p0 from the page: cell %q, api %+v", p0Quarantine, after.Backends)
	}

	// Sign out: the form is back and the old cookie opens nothing.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("#logout")),
		chromedp.WaitVisible(chromedp.CSS("#login form")),
	); err != nil {
		t.Fatalf("logout: %v", err)
	}
	if code := adminGet(t, scene.GW.URL+"/admin/backends", "", session.Value, nil); code != 401 {
		t.Fatalf("the signed-out session still reads /admin/backends: %d", code)
	}
}

// The page's files carry the headers that keep it to its own scripts, and any other file 404s.
func TestStatusPageFilesAndHeaders(t *testing.T) {
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf("backends: [{name: x, url: \"http://127.0.0.1:9\", role: unified}]\nadmin_key_sha256: %q\n", testkit.KeySHA256("k"))))
	for path, ctype := range map[string]string{"": "text/html", "app.js": "text/javascript", "style.css": "text/css"} {
		resp, err := http.Get(gw.URL + "/admin/ui/" + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") || resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("/admin/ui/%s: %d %v", path, resp.StatusCode, resp.Header)
		}
	}
	for _, path := range []string{"../api.go", "missing.js", "static/index.html", "session"} {
		resp, err := http.Get(gw.URL + "/admin/ui/" + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := 404
		if path == "session" {
			want = 401 // no session yet
		}
		if resp.StatusCode != want {
			t.Errorf("/admin/ui/%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// During a Redis outage the incident and tenant lists cannot be read (503), and that is exactly
// when the page is opened: the backends, which the replica reads itself, still show, and the
// failures are named.
func TestStatusPageWithRedisDown(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	dead := procs.FreePort(t) // nothing listens there
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf(
		"backends: [{name: u0, url: %q, role: unified}]\nadmin_key_sha256: %q\nstate: {redis_url: \"redis://127.0.0.1:%d/0\"}\n",
		sim.URL, testkit.KeySHA256("the-admin-key"), dead)))
	ctx := browser(t)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(gw.URL+"/admin/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#login form")),
		chromedp.SendKeys(chromedp.CSS("#key"), "the-admin-key"),
		chromedp.Submit(chromedp.CSS("#key")),
		chromedp.WaitVisible(chromedp.CSS(`body[data-loaded="1"]`)),
		chromedp.WaitVisible(chromedp.CSS("#error")),
	); err != nil {
		t.Fatalf("login with Redis down: %v", err)
	}
	if got := text(t, ctx, `tr[data-backend="u0"] td[data-field="pool"]`); got != "4,096" {
		t.Errorf("u0's pool with Redis down: %q", got)
	}
	if msg := text(t, ctx, "#error"); !strings.Contains(msg, "incidents") {
		t.Errorf("the error line does not name the incident list: %q", msg)
	}
}
