package leakwatch

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
)

func memWatcher(t *testing.T) *Watcher {
	t.Helper()
	st, err := state.Open(&config.Config{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return New(Options{Canary: config.Canary{Enabled: true, Secret: "leakwatch test secret, padded to 32 bytes", DetectWindow: time.Hour},
		Tenants: []string{"alice", "bob"}, State: st, Quarantine: func(map[string]time.Time) {}, Registry: prometheus.NewRegistry(),
		Log: zap.NewNop(), Background: func(_ string, work func(context.Context)) { work(context.Background()) }})
}

// A stolen marker the client itself sent (in a tool definition, or written with JSON escapes)
// is in its echo set: its reply repeating it is an echo, not a leak.
func TestEchoSetHoldsTheClientsOwnMarkers(t *testing.T) {
	w := memWatcher(t)
	bob, _ := w.keyring.Current("bob", time.Now())
	alice := &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","description":"` + bob + `"}}]}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","description":"\u004bVG-` + bob[4:] + `"}}]}`,
	} {
		req, e := request.Parse(request.Chat, []byte(body))
		if e != nil {
			t.Fatal(e)
		}
		x := w.Begin("r", "e", alice, request.Chat, req)
		if len(x.echoes) != 1 || x.echoes[0] != bob {
			t.Fatalf("echo set %v should hold bob's marker", x.echoes)
		}
	}
}

// A leak the guard reports is recorded against the path the watch was told, and quarantines it.
func TestLeakQuarantinesThePath(t *testing.T) {
	w := memWatcher(t)
	var applied map[string]time.Time
	w.quarantine = state.NewQuarantines(w.state.Quarantine, func(m map[string]time.Time) { applied = m })
	req, e := request.Parse(request.Chat, []byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	if e != nil {
		t.Fatal(e)
	}
	x := w.Begin("r1", "e1", &tenants.Tenant{Tenant: config.Tenant{Name: "alice"}}, request.Chat, req)
	x.backends = []string{"p", "d"}
	bob, _ := w.keyring.Current("bob", time.Now())
	x.Leak(canary.Hit{Marker: bob, Victim: "bob"})
	incs, err := w.state.Incidents.List(context.Background(), 10)
	if err != nil || len(incs) != 1 || incs[0].RequestID != "r1" || incs[0].Victim != "bob" || !incs[0].Quarantined {
		t.Fatalf("incidents %+v (%v)", incs, err)
	}
	if _, ok := applied["p"]; !ok {
		t.Fatalf("the path is not quarantined: %v", applied)
	}
}
