package gateway_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// dnsServer answers A queries for one name from a list the test changes; anything else is
// NXDOMAIN. It serves UDP on a free loopback port until the test ends.
type dnsServer struct {
	addr string
	mu   sync.Mutex
	name string
	ips  []string
}

func startDNS(t *testing.T, name string, ips ...string) *dnsServer {
	t.Helper()
	d := &dnsServer{name: dns.Fqdn(name), ips: ips}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, qq := range q.Question {
			if !strings.EqualFold(qq.Name, d.name) {
				m.Rcode = dns.RcodeNameError
				continue
			}
			if qq.Qtype != dns.TypeA {
				continue // no AAAA: an empty answer
			}
			for _, ip := range d.ips {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(ip)})
			}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return d
}

func (d *dnsServer) set(ips ...string) {
	d.mu.Lock()
	d.ips = ips
	d.mu.Unlock()
}

// discover: dns on one entry: a DNS server in the test answers with 127.0.0.2, then adds
// 127.0.0.3 (a simulator on the same port) and 127.0.0.4 (nothing listens): the new engine joins
// once polled, the dead address never takes a request. Then the answer drops 127.0.0.2 while a
// slow stream runs on it: the stream finishes whole, and new requests go to the members left.
func TestDiscoveryDNS(t *testing.T) {
	port := procs.FreePort(t)
	simArgs := func(host string) []string {
		return []string{"--listen", fmt.Sprintf("%s:%d", host, port), "--mode", "combined", "--pool-tokens", "4096", "--context-length", "8192", "--token-delay", "20ms"}
	}
	a := procs.StartSim(t, simArgs("127.0.0.2")...)
	b := procs.StartSim(t, simArgs("127.0.0.3")...)
	d := startDNS(t, "engines.test", "127.0.0.2")
	yaml := fmt.Sprintf(`backends:
  - {name: pool, url: "http://engines.test:%d", role: unified, discover: dns}
discovery: {interval: 100ms, resolver: %q}
tenants:
  - {name: alice, key_sha256: %q}
capacity: {poll_interval: 100ms}
`, port, d.addr, testkit.KeySHA256(tenantKey))
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, yaml))
	chats := func(s *procs.Sim) int { return s.Stats(t).Requests["/v1/chat/completions"] }
	if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 200 {
		t.Fatalf("via the one discovered member: %d %s", r.status, r.body)
	}
	if chats(a) != 1 || chats(b) != 0 || gw.Set.Get("pool@127.0.0.2") == nil {
		t.Fatalf("first answer: a=%d b=%d members=%d", chats(a), chats(b), len(gw.Set.All()))
	}

	d.set("127.0.0.2", "127.0.0.3", "127.0.0.4")
	eventually(t, 5*time.Second, "127.0.0.3 joined and was read", func() bool {
		m := gw.Set.Get("pool@127.0.0.3")
		return m != nil && m.Capacity() != nil && gw.Set.Get("pool@127.0.0.4") != nil
	})
	for i := 0; i < 30 && chats(b) == 0; i++ {
		if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 200 {
			t.Fatalf("with a dead member in the answer: %d %s", r.status, r.body)
		}
	}
	if chats(b) == 0 {
		t.Fatal("the new member never took a request")
	}
	if dead := gw.Set.Get("pool@127.0.0.4"); dead.LastError() == "" || dead.Capacity() != nil {
		t.Fatalf("127.0.0.4 (nothing listening) must be down and unread: %q", dead.LastError())
	}

	// 127.0.0.2 alone, so that the stream lands there; then it leaves the answer mid-stream.
	d.set("127.0.0.2")
	eventually(t, 5*time.Second, "only 127.0.0.2 left", func() bool { return len(gw.Set.All()) == 1 })
	req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(
		`{"model":"sim","stream":true,"messages":[{"role":"user","content":"tell me a story"}],"max_tokens":60}`))
	req.Header.Set("Authorization", "Bearer "+tenantKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", err, resp)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first event")
	}
	d.set("127.0.0.3") // 127.0.0.2 leaves mid-stream
	eventually(t, 5*time.Second, "127.0.0.2 left", func() bool { return gw.Set.Get("pool@127.0.0.2") == nil })
	events, last := 1, ""
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: ") {
			events++
			last = l
		}
	}
	if last != "data: [DONE]" || events < 20 {
		t.Fatalf("the stream on the member that left must finish whole: %d events, last %q", events, last)
	}
	before := chats(a)
	for i := 0; i < 3; i++ {
		if r := post(t, gw.URL, "/v1/chat/completions", tenantKey, smallChat); r.status != 200 {
			t.Fatalf("after 127.0.0.2 left: %d %s", r.status, r.body)
		}
	}
	if chats(a) != before {
		t.Fatalf("a member that left took %d new requests", chats(a)-before)
	}
}
