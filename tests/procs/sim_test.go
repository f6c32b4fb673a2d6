package procs

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

func TestFlagValue(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--api-key", "k1"}, "k1"},
		{[]string{"-api-key=k2", "--mode", "decode"}, "k2"},
		{[]string{"--api-key", "a", "--api-key=b"}, "b"},
		{[]string{"api-key", "x"}, ""},
		{[]string{"--api-keys", "x"}, ""},
		{nil, ""},
	}
	for _, c := range cases {
		if got := flagValue(c.args, "api-key"); got != c.want {
			t.Errorf("flagValue(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

func TestFreePortIsBindable(t *testing.T) {
	p := FreePort(t)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		t.Fatalf("port %d from FreePort not bindable: %v", p, err)
	}
	l.Close()
}

func TestStartRestartStop(t *testing.T) {
	s := StartSim(t, "--pool-tokens", "2048", "--context-length", "4096", "--page-size", "16", "--api-key", "k")
	if !strings.HasPrefix(s.URL, "http://127.0.0.1:") || s.BootstrapPort != 0 {
		t.Fatalf("URL %q, bootstrap port %d", s.URL, s.BootstrapPort)
	}
	st := s.Stats(t) // carries the key from Args
	if st.Pool.PagesTotal != 128 || st.Requests["/generate"] != 0 {
		t.Fatalf("stats %+v", st)
	}
	addr := s.Addr
	s.Restart(t, "--mode", "prefill", "--bootstrap-port", "0", "--pool-tokens", "1024", "--context-length", "4096", "--page-size", "16")
	if s.Addr != addr {
		t.Fatalf("restarted on %s, want %s", s.Addr, addr)
	}
	if s.BootstrapPort == 0 {
		t.Errorf("prefill restart: no bootstrap port")
	}
	if st := s.Stats(t); st.Pool.PagesTotal != 64 {
		t.Errorf("restart kept old args: %+v", st)
	}
	s.Stop()
	s.Stop() // idempotent
	if resp, err := http.Get(s.URL + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("simulator still answers after Stop")
	}
}
