package audit

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// maxReplyBytes bounds how much of one reply is read: enough for any probe's reply (they ask for
// few tokens), small enough that a misbehaving target cannot exhaust memory.
const maxReplyBytes = 8 << 20

// errUnreachable marks a discovery failure at the transport level (exit 2).
var errUnreachable = errors.New("target unreachable")

// endpoint is one server the audit talks to.
type endpoint struct {
	role string // target | prefill | decode
	base string // "http://host:port", no trailing slash
}

// client speaks HTTP to the given endpoints only: no proxy from the environment, no redirects,
// so no request ever goes to an address the operator did not give.
type client struct {
	http   *http.Client
	apiKey string
}

func newClient(apiKey string, timeout time.Duration, conns int) *client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: min(timeout, 5*time.Second)}).DialContext,
		MaxIdleConnsPerHost: max(conns, 2) * 2,
		// Replies are read whole and are small; compression would only hide the bytes scanned.
		DisableCompression: true,
	}
	return &client{
		http: &http.Client{Transport: tr, Timeout: timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		apiKey: apiKey,
	}
}

func (c *client) do(ctx context.Context, method, u string, body []byte) (int, []byte, error) {
	return c.doLimit(ctx, method, u, body, maxReplyBytes)
}

// doLimit is do reading at most limit bytes of the reply.
func (c *client) doLimit(ctx context.Context, method, u string, body []byte, limit int64) (int, []byte, error) {
	code, _, b, err := c.doAs(ctx, method, u, body, limit, reqOpts{})
	return code, b, err
}

// reqOpts change one request: another key than the audit's, and headers to add.
type reqOpts struct {
	key string // "" = the audit's --api-key
	hdr map[string]string
}

// doAs is doLimit with opts, also returning the reply's headers.
func (c *client) doAs(ctx context.Context, method, u string, body []byte, limit int64, opts reqOpts) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	key := c.apiKey
	if opts.key != "" {
		key = opts.key
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range opts.hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	return resp.StatusCode, resp.Header, b, err
}

// parseBase checks that s is an http(s) URL with a host and returns it without a trailing slash.
func parseBase(flagName, s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%s: %q is not an http:// or https:// URL", flagName, s)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/"), nil
}

// discover reads /v1/models, /server_info and whether /tokenize answers. A transport error on
// /v1/models is errUnreachable; 401/403 names --api-key; anything else is a note and discovery
// goes on, since /server_info alone may give the limit.
func (c *client) discover(ctx context.Context, ep endpoint, model string) (Server, error) {
	s := Server{Role: ep.role, URL: ep.base}
	code, body, err := c.do(ctx, "GET", ep.base+"/v1/models", nil)
	if err != nil {
		var ue *url.Error // its text repeats the method and URL said here
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return s, fmt.Errorf("%w: GET %s/v1/models: %v", errUnreachable, ep.base, err)
	}
	switch {
	case code == 401 || code == 403:
		return s, fmt.Errorf("GET %s/v1/models answered %d: give the target's key with --api-key", ep.base, code)
	case code != 200:
		s.Notes = append(s.Notes, fmt.Sprintf("/v1/models answered %d", code))
	default:
		var m struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
				OwnedBy     string `json:"owned_by"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &m); err != nil {
			s.Notes = append(s.Notes, "/v1/models: not the OpenAI list shape: "+err.Error())
		}
		for i, d := range m.Data {
			if i == 0 || d.ID == model {
				s.Model, s.Context, s.OwnedBy = d.ID, d.MaxModelLen, d.OwnedBy
			}
		}
		if s.Context <= 0 {
			s.Notes = append(s.Notes, "/v1/models gives no max_model_len")
		}
	}

	// /get_server_info is the deprecated name; older engines answer only it.
	code, body, err = c.do(ctx, "GET", ep.base+"/server_info", nil)
	if err == nil && code == 404 {
		code, body, err = c.do(ctx, "GET", ep.base+"/get_server_info", nil)
	}
	switch {
	case err != nil:
		s.Notes = append(s.Notes, "/server_info: "+err.Error())
	case code != 200:
		s.Notes = append(s.Notes, fmt.Sprintf("/server_info answered %d: KV pool unknown", code))
	default:
		var info struct {
			Pool  int             `json:"max_total_num_tokens"`
			MRIL  int             `json:"max_req_input_len"`
			Mode  json.RawMessage `json:"disaggregation_mode"`
			BPort *int            `json:"disaggregation_bootstrap_port"`
		}
		if err := json.Unmarshal(body, &info); err != nil {
			s.Notes = append(s.Notes, "/server_info: "+err.Error())
		}
		s.Pool, s.MaxReqInputLen = info.Pool, info.MRIL
		var mode string
		if json.Unmarshal(info.Mode, &mode) == nil {
			s.Mode = mode
		}
		if info.BPort != nil {
			s.BootstrapPort = *info.BPort
		}
	}
	if _, err := c.count(ctx, ep.base, model, " the"); err == nil {
		s.Tokenize = true
	}
	return s, nil
}

// count asks base's /tokenize (then /v1/tokenize) for the exact token count of text.
// add_special_tokens is true because generation adds them too (a BOS, for many models).
func (c *client) count(ctx context.Context, base, model, text string) ([]int, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": text, "add_special_tokens": true})
	var last error
	// The reply lists every token id: at most one token per byte of text, each id a few digits
	// and a comma, so it may be several times the text's size.
	limit := int64(8*len(text)) + 64<<10
	for _, p := range []string{"/tokenize", "/v1/tokenize"} {
		code, rb, err := c.doLimit(ctx, "POST", base+p, body, limit)
		if err != nil {
			return nil, err
		}
		if code != 200 {
			last = fmt.Errorf("POST %s answered %d", p, code)
			continue
		}
		var r struct {
			Tokens []int `json:"tokens"`
			Count  *int  `json:"count"`
		}
		if err := json.Unmarshal(rb, &r); err != nil {
			return nil, fmt.Errorf("POST %s: %w", p, err)
		}
		if r.Count != nil && *r.Count != len(r.Tokens) {
			return nil, fmt.Errorf("POST %s: count %d but %d tokens", p, *r.Count, len(r.Tokens))
		}
		return r.Tokens, nil
	}
	return nil, last
}

// result is one generation request's outcome.
type result struct {
	status      int
	text        string // the reply's generated text, decoded (streams reassembled)
	raw         []byte // the reply body as read (decode's, for a PD pair)
	streamError string // an error event inside a 200 stream
	err         error  // transport error or timeout: no status
	timeout     bool
	prefill     string // PD: what the prefill leg answered, when it matters
	elapsed     time.Duration
	header      http.Header
	prefillRaw  []byte // PD: the prefill leg's reply (its own cached-token figure)
}

// sender sends generation requests to one target, or to a PD pair as a PD router does.
type sender struct {
	c             *client
	native        bool
	model         string
	target        *endpoint // one endpoint, or
	prefill       *endpoint // a pair
	decode        *endpoint
	bootstrapHost string
	bootstrapPort int // 0: null, "use your own"
}

func (s *sender) path() string {
	if s.native {
		return "/generate"
	}
	return "/v1/completions"
}

// send posts body (with bootstrap fields added for a pair) and reads the reply.
func (s *sender) send(ctx context.Context, body map[string]any, stream bool) result {
	return s.sendAs(ctx, body, stream, reqOpts{})
}

// sendAs is send with opts on every leg.
func (s *sender) sendAs(ctx context.Context, body map[string]any, stream bool, opts reqOpts) result {
	start := time.Now()
	body["stream"] = stream
	if s.target != nil {
		r := s.one(ctx, s.target.base, body, stream, opts)
		r.elapsed = time.Since(start)
		return r
	}
	// The identical body, with a fresh room, to both legs at once; decode's reply is the answer.
	body["bootstrap_host"] = s.bootstrapHost
	if s.bootstrapPort > 0 {
		body["bootstrap_port"] = s.bootstrapPort
	} else {
		body["bootstrap_port"] = nil
	}
	body["bootstrap_room"] = randomRoom()
	pc := make(chan result, 1)
	go func() { pc <- s.one(ctx, s.prefill.base, body, stream, opts) }()
	d := s.one(ctx, s.decode.base, body, stream, opts)
	p := <-pc
	d.prefillRaw = p.raw
	switch {
	case p.err != nil:
		d.prefill = "prefill: " + p.err.Error()
	case p.status < 200 || p.status > 299:
		d.prefill = fmt.Sprintf("prefill %d", p.status)
		// A router reports a failed prefill even when decode answered.
		if d.err == nil && d.status >= 200 && d.status <= 299 {
			d.prefill += " (decode answered regardless)"
		}
	default:
		d.prefill = fmt.Sprintf("prefill %d", p.status)
	}
	d.elapsed = time.Since(start)
	return d
}

func (s *sender) one(ctx context.Context, base string, body map[string]any, stream bool, opts reqOpts) result {
	b, err := json.Marshal(body)
	if err != nil {
		return result{err: err}
	}
	code, hdr, rb, err := s.c.doAs(ctx, "POST", base+s.path(), b, maxReplyBytes, opts)
	if err != nil {
		var ne net.Error
		return result{err: err, timeout: errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())}
	}
	r := result{status: code, raw: rb, header: hdr}
	if stream && code == 200 {
		r.text, r.streamError = parseSSE(rb, s.native)
	} else {
		r.text = replyText(rb)
	}
	return r
}

// replyText extracts generated text from a non-streamed reply of either API (a native batch is
// a list); an error body yields its message, since error text can quote a prompt too.
func replyText(b []byte) string {
	var one genericReply
	if json.Unmarshal(b, &one) == nil {
		return one.text()
	}
	var many []genericReply
	if json.Unmarshal(b, &many) == nil {
		var sb strings.Builder
		for _, r := range many {
			sb.WriteString(r.text())
		}
		return sb.String()
	}
	return ""
}

type genericReply struct {
	Text    *string `json:"text"` // native
	Choices []struct {
		Text    *string `json:"text"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
	} `json:"choices"`
	Error json.RawMessage `json:"error"`
	Msg   string          `json:"message"` // SGLang's OpenAI error envelope is flat
}

func (g *genericReply) text() string {
	var sb strings.Builder
	if g.Text != nil {
		sb.WriteString(*g.Text)
	}
	for _, c := range g.Choices {
		if c.Text != nil {
			sb.WriteString(*c.Text)
		}
		if c.Message != nil {
			sb.WriteString(c.Message.Content)
		}
		if c.Delta != nil {
			if c.Delta.ReasoningContent != nil {
				sb.WriteString(*c.Delta.ReasoningContent)
			}
			if c.Delta.Content != nil {
				sb.WriteString(*c.Delta.Content)
			}
		}
	}
	sb.WriteString(errorMessage(g.Error))
	sb.WriteString(g.Msg)
	return sb.String()
}

// errorMessage reads {"message":…} or a bare string.
func errorMessage(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// parseSSE reassembles a stream's text. Native /generate events carry the whole text so far
// (SGLang's default), so the longest one is the text; OpenAI events carry deltas, concatenated.
// Markers are looked for in this text, not in the raw events: a marker spans many events.
func parseSSE(b []byte, native bool) (text, streamErr string) {
	var sb strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "" || data == "[DONE]" {
			continue
		}
		var ev genericReply
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		if m := errorMessage(ev.Error); m != "" {
			streamErr = m
			continue
		}
		if native {
			if t := ev.text(); len(t) > len(text) {
				text = t
			}
			continue
		}
		sb.WriteString(ev.text())
	}
	if !native {
		text = sb.String()
	}
	return text, streamErr
}

// randomRoom is a bootstrap_room in [0, 2^63−1], new for every request.
func randomRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) >> 1
}
