package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/lab/enginesim"
	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"go.uber.org/zap"
)

// The demo's engines: a prefill pool far smaller than the context, as in the incident, and a
// decode pool large enough to reserve pages for the oversized prompt.
const (
	demoContext    = 65536
	demoPrefill    = 16384
	demoDecode     = 65536
	demoOversized  = 30000 // words ≈ tokens: past prefill's max_req_input_len, under the context
	demoWarmTenant = 6
)

var markerRE = regexp.MustCompile(`KVG-[a-z2-7]{20}`)

func runDemo(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	once := fs.Bool("once", false, "use ephemeral ports and exit after the walkthrough")
	listen := fs.String("listen", "127.0.0.1:8080", "gateway address when not --once")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, *once, *listen); err != nil {
		fmt.Fprintln(os.Stderr, "kvgate demo:", err)
		return 1
	}
	return 0
}

func demo(ctx context.Context, once bool, listen string) error {
	fmt.Println("kvgate demo: a prefill/decode pair of simulated engines with the disaggregation leak bug")
	common := enginesim.Config{ContextLength: demoContext, PageSize: 64, Bug: kvmodel.BugAdmitRejected, Seed: 1, BootstrapPort: 0}
	pcfg, dcfg := common, common
	pcfg.Mode, pcfg.PoolTokens = enginesim.ModePrefill, demoPrefill
	dcfg.Mode, dcfg.PoolTokens = enginesim.ModeDecode, demoDecode
	prefill, err := enginesim.Start(pcfg)
	if err != nil {
		return fmt.Errorf("starting prefill engine: %w", err)
	}
	defer prefill.Close()
	decode, err := enginesim.Start(dcfg)
	if err != nil {
		return fmt.Errorf("starting decode engine: %w", err)
	}
	defer decode.Close()
	fmt.Printf("  prefill http://%s  pool %d tokens, context %d, max_req_input_len %d\n", prefill.Addr(), demoPrefill, demoContext, prefill.MaxReqInputLen())
	fmt.Printf("  decode  http://%s  pool %d tokens\n", decode.Addr(), demoDecode)

	// Other tenants' recent requests, each carrying its tenant's canary marker throughout, warm
	// the decode pool (sizes differ so LIFO reuse does not simply overwrite one with the next).
	secret := []byte("demo-secret")
	epoch := uint64(time.Now().Unix() / 3600)
	warm := map[string]string{}
	for i := 0; i < demoWarmTenant; i++ {
		tenant := fmt.Sprintf("tenant-%d", i+1)
		m := canary.Marker(secret, tenant, epoch)
		warm[m] = tenant
		var b strings.Builder
		for j := 0; j < 400+i*150; j++ {
			if j%3 == 0 { // dense markers, as canary.every_bytes places them
				b.WriteString(m + " ")
			}
			fmt.Fprintf(&b, "%s-private-%d ", tenant, j)
		}
		if code, _, err := pdGenerate(prefill, decode, b.String(), 8); err != nil || code != 200 {
			return fmt.Errorf("warm-up request for %s: status %d: %v", tenant, code, err)
		}
	}
	oversized := strings.Repeat("tell me everything ", demoOversized/3)

	// 1. Straight to the engines, the PD way: the engine answers 200 with other tenants' text.
	code, body, err := pdGenerate(prefill, decode, oversized, 256)
	if err != nil {
		return fmt.Errorf("direct request: %w", err)
	}
	foreign := map[string]bool{}
	for _, m := range markerRE.FindAllString(string(body), -1) {
		if warm[m] != "" {
			foreign[m] = true
		}
	}
	fmt.Printf("direct: HTTP %d foreign_markers=%d\n", code, len(foreign))
	if os.Getenv("KVGATE_DEMO_DEBUG") != "" {
		fmt.Println(string(body))
	}

	// 2. The same prompt through the gateway.
	key := "sk-demo-" + randomHex(12)
	adminKey := "admin-" + randomHex(12)
	gwListen := listen
	if once {
		gwListen = "127.0.0.1:0"
	}
	yaml := fmt.Sprintf(`listen: %q
admin_key_sha256: %q
backends:
  - {name: prefill-0, url: "http://%s", role: prefill}
  - {name: decode-0, url: "http://%s", role: decode}
tenants:
  - {name: demo, key_sha256: %q}
capacity: {poll_interval: 1s}
`, gwListen, sha256Hex(adminKey), prefill.Addr(), decode.Addr(), sha256Hex(key))
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		return err
	}
	log := zap.NewNop()
	if !once {
		log = gateway.NewLogger()
	}
	defer func() { _ = log.Sync() }()
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gw, ln, err := gateway.Start(gctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() { _ = gw.Shutdown(context.Background()) }()
	base := "http://" + ln.Addr().String()
	if err := waitReady(base); err != nil {
		return err
	}
	reqBody, _ := json.Marshal(map[string]any{"text": oversized, "sampling_params": map[string]any{"max_new_tokens": 256}})
	req, _ := http.NewRequest("POST", base+"/generate", bytes.NewReader(reqBody))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("gateway request: %w", err)
	}
	gbody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(gbody, &e)
	fmt.Printf("gateway: HTTP %d %s\n", resp.StatusCode, e.Error.Code)
	if e.Error.Message != "" {
		fmt.Printf("  %s\n", e.Error.Message)
	}
	if resp.StatusCode != 413 {
		return fmt.Errorf("the gateway should have refused the oversized prompt, got %d", resp.StatusCode)
	}
	if once {
		return nil
	}
	fmt.Printf(`
The gateway keeps serving on %s until interrupted (Ctrl-C).
  API key:   %s
  admin key: %s
  try:  curl -s %s/v1/chat/completions -H 'Authorization: Bearer %s' -d '{"model":"sim","messages":[{"role":"user","content":"Hello!"}],"max_tokens":16}'
        curl -s %s/admin/backends -H 'Authorization: Bearer %s'
        curl -s %s/metrics -H 'Authorization: Bearer %s'   (it needs a key: here the admin key)
`, base, key, adminKey, base, key, base, adminKey, base, adminKey)
	<-ctx.Done()
	return nil
}

// pdGenerate sends one /generate the way a PD router does: the same body, with bootstrap fields,
// to prefill and decode at once; it returns decode's reply.
func pdGenerate(prefill, decode *enginesim.Server, text string, maxNew int) (int, []byte, error) {
	var room [8]byte
	_, _ = rand.Read(room[:])
	body, _ := json.Marshal(map[string]any{
		"text": text, "sampling_params": map[string]any{"max_new_tokens": maxNew},
		"bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.BootstrapPort(),
		"bootstrap_room": uint64(room[0]&0x7f)<<56 | uint64(room[1])<<48 | uint64(room[2])<<40 | uint64(room[3])<<32 | uint64(room[4])<<24,
	})
	type result struct {
		code int
		body []byte
		err  error
	}
	send := func(addr string, out chan<- result) {
		resp, err := http.Post("http://"+addr+"/generate", "application/json", bytes.NewReader(body))
		if err != nil {
			out <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- result{resp.StatusCode, b, err}
	}
	pc, dc := make(chan result, 1), make(chan result, 1)
	go send(prefill.Addr(), pc)
	go send(decode.Addr(), dc)
	p, d := <-pc, <-dc
	if p.err != nil {
		return 0, nil, fmt.Errorf("prefill: %w", p.err)
	}
	return d.code, d.body, d.err
}

func waitReady(base string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("gateway not ready after 10s")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sha256Hex(s string) string { return config.SHA256Hex(s) }
