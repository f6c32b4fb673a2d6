package admin_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/admin/ui"
	"github.com/kvgate/kvgate/tests/testkit"
)

// from is a client whose connections leave from the loopback address ip (127.0.0.0/8 binds
// without setup), so one gateway sees several client addresses.
func from(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func send(t *testing.T, c *http.Client, method, u, body, bearer string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func loginForm(key string) string { return url.Values{"key": {key}}.Encode() }

// floodLogins sends 200 wrong admin keys to the login from c: how many were checked (303 to
// ?login=failed) and how many refused unchecked (429 with a Retry-After).
func floodLogins(t *testing.T, c *http.Client, base string) (answered, throttled int) {
	t.Helper()
	for i := 0; i < 200; i++ {
		r := send(t, c, "POST", base+"/admin/ui/login", loginForm(fmt.Sprintf("guess-%d", i)), "")
		switch {
		case r.StatusCode == 303 && strings.HasSuffix(r.Header.Get("Location"), "?login=failed"):
			answered++
		case r.StatusCode == 429:
			if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 {
				t.Fatalf("429 without a Retry-After: %v", r.Header)
			}
			throttled++
		default:
			t.Fatalf("wrong key %d: %d %v", i, r.StatusCode, r.Header)
		}
	}
	if answered > 10 || answered+throttled != 200 {
		t.Fatalf("200 wrong keys from one address: %d checked, %d throttled", answered, throttled)
	}
	return answered, throttled
}

func gatewayWith(t *testing.T, server string) *testkit.Gateway {
	return testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf(
		"backends: [{name: x, url: \"http://127.0.0.1:9\", role: unified}]\nadmin_key_sha256: %q\nserver: {metrics_key_sha256: %q%s}\n",
		testkit.KeySHA256("the-admin-key"), testkit.KeySHA256("the-scrape-key"), server)))
}

// Issue 31: the status page's login answered 200 wrong admin keys in 0.2 s. With the default
// server.auth_throttle, one address now gets at most 10 of 200 keys checked; the rest are 429s
// with Retry-After. Another address still logs in with the admin key meanwhile.
func TestWrongAdminKeysAreThrottledPerAddress(t *testing.T) {
	gw := gatewayWith(t, "")
	answered, throttled := floodLogins(t, from("127.0.0.1"), gw.URL)
	operator := from("127.0.0.2")
	r := send(t, operator, "POST", gw.URL+"/admin/ui/login", loginForm("the-admin-key"), "")
	if r.StatusCode != 303 || !strings.HasSuffix(r.Header.Get("Location"), "/admin/ui/") || len(r.Cookies()) != 1 || r.Cookies()[0].Name != ui.CookieName {
		t.Fatalf("the admin key from another address: %d %v %v", r.StatusCode, r.Header.Get("Location"), r.Cookies())
	}
	body := scrape(t, operator, gw.URL, "the-scrape-key")
	for _, want := range []string{
		fmt.Sprintf(`kvgate_admin_auth_failures_total{via="login"} %d`, answered),
		fmt.Sprintf(`kvgate_admin_auth_throttled_total{via="login"} %d`, throttled),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	t.Logf("200 wrong logins from one address: %d checked, %d throttled", answered, throttled)
}

// While an address waits (here a backoff longer than the test, so it surely still does), its
// keys are not checked at all: the admin key itself gets a 429, as a login, on /admin/ and on
// /metrics. Other addresses are served. Wrong bearer keys on /admin/ and /metrics are strikes
// like wrong logins; a request without a key is not a guess and costs the address nothing.
func TestThrottledAddressIsRefusedEvenTheRightKey(t *testing.T) {
	gw := gatewayWith(t, ", auth_throttle: {backoff: 10m}")
	attacker, operator, scraper := from("127.0.0.1"), from("127.0.0.2"), from("127.0.0.3")
	if answered, _ := floodLogins(t, attacker, gw.URL); answered != 5 {
		t.Fatalf("free_failures 5: %d checked", answered)
	}
	if r := send(t, attacker, "POST", gw.URL+"/admin/ui/login", loginForm("the-admin-key"), ""); r.StatusCode != 429 || len(r.Cookies()) != 0 {
		t.Fatalf("the right key from the throttled address: %d %v", r.StatusCode, r.Cookies())
	}
	for _, p := range []string{"/admin/backends", "/metrics"} {
		if r := send(t, attacker, "GET", gw.URL+p, "", "the-admin-key"); r.StatusCode != 429 {
			t.Fatalf("%s with the admin key from the throttled address: %d", p, r.StatusCode)
		}
	}
	if r := send(t, operator, "GET", gw.URL+"/admin/backends", "", "the-admin-key"); r.StatusCode != 200 {
		t.Fatalf("admin API from another address: %d", r.StatusCode)
	}
	for i := 0; i < 30; i++ {
		if r := send(t, scraper, "GET", gw.URL+"/admin/incidents", "", ""); r.StatusCode != 401 {
			t.Fatalf("no key: %d", r.StatusCode)
		}
	}
	if r := send(t, scraper, "GET", gw.URL+"/metrics", "", "the-scrape-key"); r.StatusCode != 200 {
		t.Fatalf("requests without a key throttled the address: %d", r.StatusCode)
	}
	codes := map[int]int{}
	for i := 0; i < 30; i++ {
		p := []string{"/admin/incidents", "/metrics"}[i%2]
		codes[send(t, scraper, "GET", gw.URL+p, "", fmt.Sprintf("guess-%d", i)).StatusCode]++
	}
	if codes[401] != 5 || codes[429] != 25 {
		t.Fatalf("30 wrong bearer keys: %v", codes)
	}
	body := scrape(t, operator, gw.URL, "the-scrape-key")
	for _, want := range []string{`kvgate_admin_auth_failures_total{via="bearer"} 3`, `kvgate_admin_auth_failures_total{via="metrics"} 2`,
		`kvgate_admin_auth_throttled_total{via="bearer"} 13`, `kvgate_admin_auth_throttled_total{via="metrics"} 14`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func scrape(t *testing.T, c *http.Client, base, key string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
