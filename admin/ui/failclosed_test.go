package ui_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// TestStatusPageShowsAndClearsFailClosed: an engine whose template adds tokens the gateway does
// not model (--bug template-drift) makes the model fail-closed; the status page lists the model
// and the count_drift incidents (model, route and both counts, no prompt text), and its Clear
// button reopens admission.
func TestStatusPageShowsAndClearsFailClosed(t *testing.T) {
	sim := procs.StartSim(t, "--bug", "template-drift")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, fmt.Sprintf("backends:\n  - {name: sim, url: %q, role: unified}\n"+
		"tenants:\n  - {name: alice, key_sha256: %q}\nadmin_key_sha256: %q\ncapacity: {poll_interval: 200ms}\n",
		sim.URL, testkit.KeySHA256("sk-alice"), testkit.KeySHA256("admin-key"))))
	chat := func() int {
		req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"private words"}],"max_tokens":2}`))
		req.Header.Set("Authorization", "Bearer sk-alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := 0; i < 10 && chat() == 200; i++ {
	}
	if code := chat(); code != 503 {
		t.Fatalf("the model is not fail-closed: %d", code)
	}

	ctx := browser(t)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(gw.URL+"/admin/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#login form")),
		chromedp.SendKeys(chromedp.CSS("#key"), "admin-key"),
		chromedp.Submit(chromedp.CSS("#key")),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-failclosed="default"]`)),
	); err != nil {
		t.Fatalf("login and the fail-closed row: %v", err)
	}
	drift := text(t, ctx, `#incidents tr:first-child td[data-field="context"]`)
	if !strings.Contains(drift, "model default, /v1/chat/completions") || !strings.Contains(drift, "engine counted") || strings.Contains(drift, "private") {
		t.Fatalf("count_drift incident on the page: %q", drift)
	}
	if kind := text(t, ctx, `#incidents tr:first-child td[data-field="kind"]`); kind != "count_drift" {
		t.Fatalf("incident kind %q", kind)
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`button[data-clear="default"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#failclosed .empty`)),
	); err != nil {
		t.Fatalf("clear: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for chat() != 200 {
		if time.Now().After(deadline) {
			t.Fatal("admission did not reopen after Clear")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
