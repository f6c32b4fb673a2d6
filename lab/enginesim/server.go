package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"github.com/kvgate/kvgate/lab/enginesim/pdxfer"
	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/kvgate/kvgate/tokenize/vision"
	"github.com/valyala/fasthttp"
)

// pageWait bounds how long a request queues for free pages before it is
// refused with 503, as a saturated engine would eventually time out.
const pageWait = 30 * time.Second

// Server is one simulated SGLang server (combined, prefill or decode).
type Server struct {
	cfg     Config
	tok     *kvmodel.CachedTokenizer
	mril    int      // rank 0's, as /server_info reports it
	ranks   []dpRank // DP attention ranks (sched.go)
	padID   uint32
	padText string
	created int64

	mu      sync.Mutex // guards pool, rng, seq, waiting, running
	cond    *sync.Cond
	pool    *kvmodel.Pool
	rng     *rand.Rand
	seq     uint64
	waiting int
	running int
	// poolFull counts requests that found the pool without room for their pages and had to
	// wait or fail (the engine's own overflow path, which admission at free KV avoids).
	poolFull int

	statsMu  sync.Mutex
	requests map[string]int
	maxPT    int
	tokReqs  int
	rejected map[string]int
	foreign  int
	// headerIDs are the X-Request-Id headers of the last generation requests (ground truth for
	// "the engine never sees the client's id").
	headerIDs []string
	// bodyRIDs are the "rid" fields of the same requests' bodies, as sent ("" when absent): the
	// ground truth for "the engine never sees a client's rid" (issue 39).
	bodyRIDs []string
	salts    map[string]struct{} // distinct cache_salt values seen

	piecesMu sync.Mutex
	pieces   map[uint32]string // chunk4 id → piece, for /detokenize

	env wire.Env // what the request parsers need from the server

	responses *responseStore // /v1/responses by id, for previous_response_id

	activeMu sync.Mutex
	active   map[string]context.CancelFunc // rid → cancel, for /abort_request

	rooms *pdxfer.Store // prefill: rooms waiting for decode

	prefix *prefixCache // what cache_salt partitions
	slots  []slotState  // the batch's rows (advisories.go); guarded by mu
	leaks  []Leak       // ground truth of the advisories' bugs; guarded by statsMu

	nextRank atomic.Uint64 // the DP controller's round robin

	pull *pdxfer.Client // decode: pulls rooms from prefill

	srv, bootSrv *fasthttp.Server
	ln, bootLn   net.Listener
	closed       atomic.Bool
}

// Start builds a server from cfg on an ephemeral loopback port and serves it in the background
// (the lab's in-process engines); Close stops it.
func Start(cfg Config) (*Server, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	go func() { _ = s.Serve() }()
	return s, nil
}

// New builds a server from cfg (defaults applied, then validated).
func New(cfg Config) (*Server, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base, err := kvmodel.NewTokenizer(cfg.Tokenizer)
	if err != nil {
		return nil, err
	}
	tok := kvmodel.NewCachedTokenizer(base)
	pool, err := kvmodel.NewPool(cfg.PoolTokens, cfg.PageSize, cfg.Allocator, cfg.Seed, true)
	if err != nil {
		return nil, err
	}
	pool.ZeroOnRelease = cfg.Fix == kvmodel.FixZeroOnRelease
	ids, texts := tok.Encode(" ")
	s := &Server{
		cfg:     cfg,
		tok:     tok,
		mril:    kvmodel.MaxReqInputLen(cfg.PoolTokens, cfg.PageSize, cfg.ContextLength),
		ranks:   newRanks(cfg),
		padID:   ids[0],
		padText: texts[0],
		created: time.Now().Unix(),
		pool:    pool,
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0xda942042e4dd58b5)),
		requests: map[string]int{"/generate": 0, "/v1/chat/completions": 0, "/v1/completions": 0,
			"/v1/responses": 0, "/v1/messages": 0, "/v1/embeddings": 0, "/v1/rerank": 0, "/v1/score": 0,
			"/v1/classify": 0, "/encode": 0, "/classify": 0},
		rejected:  map[string]int{},
		salts:     map[string]struct{}{},
		pieces:    map[uint32]string{},
		responses: &responseStore{m: map[string]conversation{}},
		active:    map[string]context.CancelFunc{},
		rooms:     pdxfer.NewStore(),
		pull:      pdxfer.NewClient(cfg.TransferTimeout),
		prefix:    newPrefixCache(cfg),
	}
	s.cond = sync.NewCond(&s.mu)
	s.env = wire.Env{NewRID: s.newRID, NoteSalts: s.noteSalts}
	if h, ok := base.(*kvmodel.HFTokenizer); ok {
		// A model with an image processor takes chat image parts, charged as its processor
		// expands them; without one they are refused, as a text-only engine refuses them.
		rule, err := vision.Load(h.Dir)
		switch {
		case err == nil:
			s.env.Images = true
		case errors.Is(err, vision.ErrNoRule), errors.Is(err, vision.ErrUnsupported):
			rule = nil
		default:
			return nil, err
		}
		s.env.RenderChat = renderChat(h, rule)
	}
	s.srv = &fasthttp.Server{
		Handler:            s.Handler(),
		Name:               "kvgate-sim",
		MaxRequestBodySize: 256 << 20,
		// No ReadTimeout/WriteTimeout: they are total deadlines in fasthttp
		// and would cut long streams (see the field notes).
		NoDefaultServerHeader: true,
		CloseOnShutdown:       true,
	}
	s.bootSrv = &fasthttp.Server{Handler: s.rooms.Handler(cfg.TransferTimeout), Name: "kvgate-sim-bootstrap", CloseOnShutdown: true}
	return s, nil
}

// Config returns the configuration in effect (defaults applied).
func (s *Server) Config() Config { return s.cfg }

// MaxReqInputLen is the limit this server reports and enforces.
func (s *Server) MaxReqInputLen() int { return s.mril }

// Listen binds the API address and, in prefill mode, the bootstrap port.
func (s *Server) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	s.ln = ln
	if s.cfg.Mode == ModePrefill {
		host, _, _ := net.SplitHostPort(ln.Addr().String())
		bl, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(s.cfg.BootstrapPort)))
		if err != nil {
			ln.Close()
			return fmt.Errorf("listening on bootstrap port %d: %w", s.cfg.BootstrapPort, err)
		}
		s.bootLn = bl
	}
	return nil
}

// Addr is the bound API address (after Listen).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// BootstrapAddr is the bound bootstrap address in prefill mode, else "".
func (s *Server) BootstrapAddr() string {
	if s.bootLn == nil {
		return ""
	}
	return s.bootLn.Addr().String()
}

// BootstrapPort is the port reported as disaggregation_bootstrap_port: the
// one bound in prefill mode, the configured one otherwise.
func (s *Server) BootstrapPort() int {
	if s.bootLn != nil {
		return s.bootLn.Addr().(*net.TCPAddr).Port
	}
	return s.cfg.BootstrapPort
}

// Serve answers on the listeners until Close. It returns nil after Close.
// Listen must have succeeded first.
func (s *Server) Serve() error {
	if s.ln == nil {
		return fmt.Errorf("enginesim: Serve before Listen")
	}
	if s.bootLn != nil {
		go func() { _ = s.bootSrv.Serve(s.bootLn) }()
	}
	err := s.srv.Serve(s.ln)
	if s.closed.Load() {
		return nil
	}
	return err
}

// Close stops both listeners and waits for open requests to finish. It may
// be called before, during or after Serve.
func (s *Server) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	// Closing the listeners ends a Serve that has not registered them yet;
	// Shutdown ends one that has, and closes idle connections.
	if s.ln != nil {
		s.ln.Close()
	}
	if s.bootLn != nil {
		s.bootLn.Close()
	}
	_ = s.bootSrv.Shutdown()
	if err := s.srv.Shutdown(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Handler is the API handler (exposed for in-process benchmarks).
func (s *Server) Handler() fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if s.cfg.APIKey != "" {
			auth := ctx.Request.Header.Peek("Authorization")
			if string(auth) != "Bearer "+s.cfg.APIKey {
				ctx.SetStatusCode(401)
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"error":"Unauthorized"}`)
				return
			}
		}
		path := string(ctx.Path())
		get, post := ctx.IsGet(), ctx.IsPost()
		switch {
		case get && (path == "/health" || path == "/health_generate"):
			ctx.SetStatusCode(200)
		case get && (path == "/server_info" || path == "/get_server_info"):
			s.serverInfo(ctx)
		case get && path == "/v1/models":
			s.models(ctx)
		case get && (path == "/v1/loads" || path == "/get_load"):
			s.loads(ctx)
		case get && path == "/metrics":
			s.metrics(ctx)
		case get && path == "/sim/stats":
			s.simStats(ctx)
		case s.cfg.Fast && post && (path == "/generate" || path == "/v1/completions" || path == "/v1/chat/completions"):
			s.handleFast(ctx, path)
		case post && path == "/generate":
			s.noteHeaders(ctx)
			s.handleGenerate(ctx)
		case post && path == "/v1/completions":
			s.noteHeaders(ctx)
			s.handleOpenAI(ctx, wire.RouteCompletions)
		case post && path == "/v1/chat/completions":
			s.noteHeaders(ctx)
			s.handleOpenAI(ctx, wire.RouteChat)
		case post && (path == "/tokenize" || path == "/v1/tokenize"):
			s.handleTokenize(ctx)
		case post && path == "/v1/responses":
			s.noteHeaders(ctx)
			s.handleResponses(ctx)
		case post && path == "/v1/messages":
			s.noteHeaders(ctx)
			s.handleMessages(ctx)
		case post && path == "/v1/messages/count_tokens":
			s.handleCountTokens(ctx)
		case post && path == "/v1/embeddings":
			s.handleEmbeddings(ctx)
		case post && path == "/v1/rerank":
			s.handleRerank(ctx)
		case post && path == "/v1/score":
			s.handleScore(ctx)
		case post && path == "/v1/classify":
			s.handleV1Classify(ctx)
		case post && (path == "/encode" || path == "/classify"):
			s.handleEncode(ctx, path)
		case post && (path == "/detokenize" || path == "/v1/detokenize"):
			s.handleDetokenize(ctx, path)
		case post && (path == "/flush_cache" || path == "/start_profile" || path == "/stop_profile" ||
			strings.HasPrefix(path, "/update_weights_from_")):
			s.handleAdmin(ctx, path)
		case post && path == "/abort_request":
			s.handleAbort(ctx)
		default:
			ctx.SetStatusCode(404)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"detail":"Not Found"}`)
		}
	}
}

// countRequest counts one arrived HTTP generation request (a batch or n>1
// is still one request).
func (s *Server) countRequest(route string) {
	s.statsMu.Lock()
	s.requests[route]++
	s.statsMu.Unlock()
}

// maxHeaderIDs bounds the X-Request-Id history kept for /sim/stats.
const maxHeaderIDs = 256

// noteHeaders remembers the request's X-Request-Id header and its body's rid (empty when absent).
func (s *Server) noteHeaders(ctx *fasthttp.RequestCtx) {
	id := string(ctx.Request.Header.Peek("X-Request-Id"))
	var body struct {
		RID json.RawMessage `json:"rid"`
	}
	_ = json.Unmarshal(ctx.PostBody(), &body) // a bad body is refused by its handler
	rid := ""
	if len(body.RID) > 0 && string(body.RID) != "null" {
		rid = string(body.RID) // as JSON: a string, or a batch's list
	}
	s.statsMu.Lock()
	if len(s.headerIDs) >= maxHeaderIDs {
		s.headerIDs = append(s.headerIDs[:0], s.headerIDs[1:]...)
		s.bodyRIDs = append(s.bodyRIDs[:0], s.bodyRIDs[1:]...)
	}
	s.headerIDs = append(s.headerIDs, id)
	s.bodyRIDs = append(s.bodyRIDs, rid)
	s.statsMu.Unlock()
}

// countPrompt keeps the largest prompt that arrived, rejected or not.
func (s *Server) countPrompt(promptTokens int) {
	s.statsMu.Lock()
	s.maxPT = max(s.maxPT, promptTokens)
	s.statsMu.Unlock()
}

// countForeign counts a reply that read another request's stale pages.
func (s *Server) countForeign() {
	s.statsMu.Lock()
	s.foreign++
	s.statsMu.Unlock()
}

func (s *Server) reject(reason string) {
	s.statsMu.Lock()
	s.rejected[reason]++
	s.statsMu.Unlock()
}

func (s *Server) logf(format string, args ...any) {
	fmt.Fprintf(s.cfg.Log, time.Now().UTC().Format("15:04:05.000")+" "+format+"\n", args...)
}

// newRID makes a request id when the body carries none: deterministic from
// the seed and the arrival order.
func (s *Server) newRID() string {
	s.mu.Lock()
	s.seq++
	n := s.seq
	s.mu.Unlock()
	return fmt.Sprintf("sim-%x-%d", s.cfg.Seed, n)
}

func (s *Server) register(rid string, cancel context.CancelFunc) {
	s.activeMu.Lock()
	s.active[rid] = cancel
	s.activeMu.Unlock()
}

func (s *Server) unregister(rid string) {
	s.activeMu.Lock()
	delete(s.active, rid)
	s.activeMu.Unlock()
}

// allocPages takes n pages, queueing up to pageWait (or until ctx ends).
func (s *Server) allocPages(ctx context.Context, n int) ([]int32, error) {
	if n > s.pool.NumPages {
		return nil, fmt.Errorf("request needs %d pages, the pool has %d", n, s.pool.NumPages)
	}
	deadline := time.Now().Add(pageWait)
	// Waking the waiters on deadline or cancellation keeps Cond usable with
	// a timeout.
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	var timer *time.Timer
	s.mu.Lock()
	defer s.mu.Unlock()
	for first := true; ; first = false {
		pages, ok := s.pool.Alloc(n, make([]int32, 0, n))
		if ok {
			s.running++
			return pages, nil
		}
		if first {
			s.poolFull++
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no free KV pages for %d pages within %v", n, pageWait)
		}
		if timer == nil {
			timer = time.AfterFunc(time.Until(deadline), func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
			defer timer.Stop()
		}
		s.waiting++
		s.cond.Wait()
		s.waiting--
	}
}

func (s *Server) releasePages(pages []int32) {
	s.mu.Lock()
	s.pool.Release(pages)
	s.running--
	s.cond.Broadcast()
	s.mu.Unlock()
}
