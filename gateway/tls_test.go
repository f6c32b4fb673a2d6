package gateway_test

import (
	"crypto/tls"
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// tlsYAML is a gateway with one unified backend at url and the given tls settings.
func tlsYAML(url, tlsSettings string) string {
	return fmt.Sprintf("backends:\n  - {name: sim, url: %q, role: unified, tls: {%s}}\ntenants:\n  - {name: alice, key_sha256: %q}\ncapacity: {poll_interval: 200ms}\n",
		url, tlsSettings, testkit.KeySHA256(tenantKey))
}

// An engine behind TLS termination that requires a client certificate, with a certificate for
// the name engine.internal only (not for the address the gateway dials): the gateway reaches it
// with tls.ca_file, a client certificate and tls.server_name, streamed and whole. A wrong CA, a
// missing server_name, a missing client certificate and a plaintext URL each leave the backend
// down (the request is a 503, never sent in clear) with the reason in the backend's last error.
func TestTLSUpstream(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192")
	ca := testkit.NewCA(t, "engines")
	serverCert, _, _ := ca.Issue(t, "engine", []string{"engine.internal"}, nil)
	_, clientCert, clientKey := ca.Issue(t, "gateway", []string{"gateway.internal"}, nil)
	front := testkit.StartTLSFront(t, sim.URL, &tls.Config{Certificates: []tls.Certificate{serverCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool, MinVersion: tls.VersionTLS12})
	good := fmt.Sprintf("ca_file: %q, cert_file: %q, key_file: %q, server_name: engine.internal", ca.CertFile, clientCert, clientKey)

	gw := testkit.StartGateway(t, testkit.ParseConfig(t, tlsYAML("https://"+front, good)))
	if r := get(t, gw.URL+"/readyz", ""); r.status != 200 {
		t.Fatalf("readyz with a good TLS setup: %d %s", r.status, r.body)
	}
	before := sim.Stats(t).Requests["/v1/chat/completions"]
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 200 || !strings.Contains(string(r.body), `"choices"`) {
		t.Fatalf("chat over TLS: %d %s", r.status, r.body)
	}
	stream := `{"model":"sim","stream":true,"messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, stream); r.status != 200 || !strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]") {
		t.Fatalf("stream over TLS: %d %s", r.status, r.body)
	}
	if got := sim.Stats(t).Requests["/v1/chat/completions"] - before; got != 2 {
		t.Fatalf("the engine saw %d requests through the TLS front, want 2", got)
	}

	other := testkit.NewCA(t, "other")
	for _, c := range []struct {
		name, url, tls, reason string
	}{
		{"wrong CA", "https://" + front, fmt.Sprintf("ca_file: %q, cert_file: %q, key_file: %q, server_name: engine.internal", other.CertFile, clientCert, clientKey), "certificate signed by unknown authority"},
		{"no server_name (the certificate is not for the address)", "https://" + front, fmt.Sprintf("ca_file: %q, cert_file: %q, key_file: %q", ca.CertFile, clientCert, clientKey), "127.0.0.1"},
		{"no client certificate", "https://" + front, fmt.Sprintf("ca_file: %q, server_name: engine.internal", ca.CertFile), ""}, // TLS 1.3: the server hangs up after the handshake
		{"plaintext to the TLS port", "http://" + front, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			gw := testkit.StartGateway(t, testkit.ParseConfig(t, tlsYAML(c.url, c.tls)))
			before := sim.Stats(t).Requests["/v1/chat/completions"]
			if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 503 {
				t.Fatalf("want 503 (backend down), got %d %s", r.status, r.body)
			}
			if r := get(t, gw.URL+"/readyz", ""); r.status != 503 {
				t.Fatalf("readyz: %d %s", r.status, r.body)
			}
			if got := sim.Stats(t).Requests["/v1/chat/completions"] - before; got != 0 {
				t.Fatalf("the engine saw %d requests", got)
			}
			last := gw.Set.Get("sim").LastError()
			if last == "" || !strings.Contains(last, c.reason) {
				t.Fatalf("backend's last error %q, want it to name %q", last, c.reason)
			}
		})
	}
}

// A backend URL without a port takes the scheme's: http://localhost is localhost:80, which
// used to pass validation and then fail at start.
func TestBackendURLDefaultPort(t *testing.T) {
	yaml := fmt.Sprintf("backends:\n  - {name: sim, url: \"http://localhost\", role: unified}\ntenants:\n  - {name: alice, key_sha256: %q}\n", testkit.KeySHA256(tenantKey))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	if a := gw.Set.Get("sim").Addr; a != "localhost:80" {
		t.Fatalf("http://localhost dials %q, want localhost:80", a)
	}
}
