package testkit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tests/markerhour"
)

// Gateway is an in-process gateway serving on an ephemeral loopback port.
type Gateway struct {
	URL    string
	Addr   string
	Config *config.Config
	Set    *backends.Set
	GW     *gateway.Gateway
	cancel context.CancelFunc
}

// KeySHA256 is the hex SHA-256 of an API key, as the config stores it.
func KeySHA256(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// ParseConfig validates YAML with no environment overrides, failing the test on error. The
// canary markers are those of the pinned test hour (markerhour.Pin), not the wall clock's.
func ParseConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	markerhour.Pin(cfg)
	return cfg
}

// StartGateway starts a gateway for cfg (its listen address is replaced by 127.0.0.1:0) and
// waits until every backend was read: /readyz answers 200, or 503 "unavailable" (a test of a
// gateway whose backends are down on purpose). Everything stops at test cleanup.
func StartGateway(t testing.TB, cfg *config.Config) *Gateway {
	t.Helper()
	return StartGatewayWithLogger(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
}

// StartGatewayWithLogger is StartGateway logging to log (a test that inspects log lines).
func StartGatewayWithLogger(t testing.TB, cfg *config.Config, log *zap.Logger) *Gateway {
	t.Helper()
	set, err := backends.New(cfg.Backends, backends.OptionsFrom(cfg), log)
	if err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(cfg, set, st, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go set.Run(ctx)
	go gw.Run(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { _ = gw.Serve(ln) }()
	g := &Gateway{URL: "http://" + ln.Addr().String(), Addr: ln.Addr().String(), Config: cfg, Set: set, GW: gw, cancel: cancel}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = gw.Shutdown(sctx)
		cancel()
		_ = st.Close()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(g.URL + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 || bytes.Contains(body, []byte(`"status":"unavailable"`)) {
				return g
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not ready after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
