package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// item is one prompt of a request (a batch holds several).
type item struct {
	rid         string
	prompt      string   // rendered text; used when ids is nil
	ids         []uint32 // input_ids, or the tokenization of prompt
	texts       []string
	maxNew      int  // tokens to generate
	maxNewGiven bool // whether maxNew takes part in the prompt+output check
	boot        bootInfo
	tenant      string
}

type bootInfo struct {
	has  bool
	host string
	port int // 0 = null: use the configured port
	room uint64
}

// outcome is the result of running one item. pages stay held until the
// reply is done, then the caller releases them.
type outcome struct {
	status       int
	msg          string
	errType      string
	promptTokens int
	gen          genOut
	pages        []int32
	finish       string // "length", "stop" or "abort"
	self         *Writer
}

func (o *outcome) failed() bool { return o.status != 200 }

func errOutcome(status int, msg string) *outcome {
	t := "BadRequestError"
	switch {
	case status >= 500:
		t = "InternalServerError"
	case status == 408:
		t = "RequestTimeout"
	}
	return &outcome{status: status, msg: msg, errType: t}
}

// checkLengths applies SGLang's three input checks in its order (the
// tokenizer manager's context and total checks, then the scheduler's pool
// check) and returns the failing reason and message.
func (s *Server) checkLengths(p, o int, oGiven bool) (reason, msg string) {
	ctxLen := s.cfg.ContextLength
	if p >= ctxLen {
		return "context", fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", p, ctxLen)
	}
	if oGiven && p+o >= ctxLen {
		return "total", fmt.Sprintf("Requested token count exceeds the model's maximum context length of %d tokens. "+
			"You requested a total of %d tokens: %d tokens from the input messages and %d tokens for the completion. "+
			"Please reduce the number of tokens in the input messages or the completion to fit within the limit.", ctxLen, p+o, p, o)
	}
	if p >= s.mril {
		return "pool", fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens). "+
			"Use a shorter input or enable --allow-auto-truncate.", p, s.mril)
	}
	return "", ""
}

// run tokenizes, checks, allocates, transfers (PD) and generates one item.
func (s *Server) run(ctx context.Context, it *item) *outcome {
	if it.ids == nil {
		it.ids, it.texts = s.tok.Encode(it.prompt)
	} else if it.texts == nil {
		it.texts = s.idTexts(it.ids)
	}
	p := len(it.ids)
	s.countPrompt(p)
	if p == 0 {
		s.reject("empty")
		return errOutcome(400, "The input is empty: at least one token is required.")
	}
	reason, msg := s.checkLengths(p, it.maxNew, it.maxNewGiven)
	stub := false
	if reason != "" {
		if reason == "pool" && s.cfg.Mode == ModePrefill && s.cfg.Bug == BugAdmitRejected && s.cfg.Fix != FixRejectAtAdmission {
			// The affected versions store the rejection in a pending field,
			// swap the prompt for a one-token stub and admit it anyway.
			stub = true
			s.reject("pool_admitted_stub")
			s.logf("BUG rid=%s prompt=%d >= max_req_input_len=%d: admitted as a one-token stub", it.rid, p, s.mril)
		} else {
			s.reject(reason)
			if s.cfg.Mode == ModePrefill && it.boot.has {
				s.rooms.abort(it.boot.room, 400, msg)
			}
			return errOutcome(400, msg)
		}
	}
	self := &Writer{RID: it.rid, Tenant: it.tenant}
	switch s.cfg.Mode {
	case ModePrefill:
		return s.runPrefill(ctx, it, self, p, stub)
	case ModeDecode:
		return s.runDecode(ctx, it, self, p)
	}
	return s.runCombined(ctx, it, self, p)
}

// genLen caps the output so prompt plus output fit the pool.
func (s *Server) genLen(p, want int) int {
	if room := s.pool.Tokens() - p; want > room {
		return max(room, 0)
	}
	return want
}

func (s *Server) pagesFor(tokens int) int { return (tokens + s.cfg.PageSize - 1) / s.cfg.PageSize }

func (s *Server) runCombined(ctx context.Context, it *item, self *Writer, p int) *outcome {
	o := s.genLen(p, it.maxNew)
	pages, err := s.allocPages(ctx, s.pagesFor(p+o))
	if err != nil {
		s.reject("no_pages")
		return errOutcome(503, err.Error())
	}
	return s.writeAndGenerate(it, self, pages, p, p, o)
}

// writeAndGenerate writes the first n prompt tokens into the request's pages (the rest keep
// whatever their last writer left there), then generates o tokens over the p-token context.
// The pages are released if generation fails, else handed to the outcome.
func (s *Server) writeAndGenerate(it *item, self *Writer, pages []int32, n, p, o int) *outcome {
	s.mu.Lock()
	v := &seqView{pool: s.pool, pages: pages, self: self}
	for i := 0; i < n; i++ {
		v.write(i, it.ids[i], it.texts[i])
	}
	out := s.generateLocked(v, p, o)
	s.mu.Unlock()
	if out.failed() {
		s.releasePages(pages)
		return out
	}
	out.pages, out.promptTokens, out.self = pages, p, self
	return out
}

// generateLocked runs the model; the ownership fix refuses first. s.mu held.
func (s *Server) generateLocked(v *seqView, p, o int) *outcome {
	if s.cfg.Fix == FixOwnershipTags {
		if _, unowned := v.contextReport(p); unowned {
			s.reject("ownership")
			return errOutcome(500, fmt.Sprintf("KV ownership check failed: request %s would read KV slots it does not own.", v.self.RID))
		}
	}
	g := v.generate(p, o, s.rng, s.padID, s.padText)
	finish := "length"
	if len(g.ids) < o {
		finish = "stop"
	}
	return &outcome{status: 200, gen: g, finish: finish}
}

func (s *Server) runPrefill(ctx context.Context, it *item, self *Writer, p int, stub bool) *outcome {
	written := p
	if stub {
		written = 1
	}
	// Prefill computes the prompt's KV and one token; max_new_tokens is
	// forced to 1 whatever the body asked for.
	pages, err := s.allocPages(ctx, s.pagesFor(written+1))
	if err != nil {
		s.reject("no_pages")
		if it.boot.has {
			s.rooms.abort(it.boot.room, 503, err.Error())
		}
		return errOutcome(503, err.Error())
	}
	s.mu.Lock()
	v := &seqView{pool: s.pool, pages: pages, self: self}
	for i := 0; i < written; i++ {
		v.write(i, it.ids[i], it.texts[i])
	}
	out := s.generateLocked(v, written, 1)
	s.mu.Unlock()
	if out.failed() {
		s.releasePages(pages)
		if it.boot.has {
			s.rooms.abort(it.boot.room, out.status, out.msg)
		}
		return out
	}
	out.promptTokens, out.self = written, self
	out.finish = "length"
	if it.boot.has {
		// The room keeps the pages until decode pulls it or it expires.
		s.rooms.put(it.boot.room, &roomData{ids: append([]uint32(nil), it.ids[:written]...), promptLen: p, rid: it.rid},
			func() { s.releasePages(pages) }, s.cfg.RoomTTL)
	} else {
		out.pages = pages
	}
	return out
}

func (s *Server) runDecode(ctx context.Context, it *item, self *Writer, p int) *outcome {
	if !it.boot.has {
		s.reject("bad_request")
		return errOutcome(400, "Decode mode requires bootstrap_host, bootstrap_port and bootstrap_room.")
	}
	if !loopbackHost(it.boot.host) {
		s.reject("bootstrap_host")
		return errOutcome(400, fmt.Sprintf("bootstrap_host %q is not a loopback address; the simulator only transfers KV over loopback.", it.boot.host))
	}
	port := it.boot.port
	if port == 0 {
		port = s.cfg.BootstrapPort
	}
	o := s.genLen(p, it.maxNew)
	// Decode reserves pages for the whole prompt, whatever arrives. SGLang preallocates them
	// before the transfer; the simulator takes them once the room is ready, so that a decode
	// waiting for its KV never holds pages that another request's prefill waits for (two full
	// pools would otherwise wait on each other until the transfer timeout).
	rd, err := s.pullRoom(ctx, it.boot.host, port, it.boot.room)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, errTransferTimeout) {
			s.reject("aborted")
			return &outcome{status: 200, finish: "abort", msg: "Abort request", self: self, promptTokens: p}
		}
		s.reject("transfer_timeout")
		return errOutcome(500, fmt.Sprintf("KV transfer for bootstrap_room %d failed: %v", it.boot.room, err))
	}
	if rd.aborted {
		s.reject("aborted_by_prefill")
		return errOutcome(rd.status, rd.msg)
	}
	pages, err := s.allocPages(ctx, s.pagesFor(p+o))
	if err != nil {
		s.reject("no_pages")
		return errOutcome(503, err.Error())
	}
	n := min(len(rd.ids), p)
	if s.cfg.Fix == FixDecodeLengthCheck && n < p {
		s.releasePages(pages)
		s.reject("decode_length")
		return errOutcome(400, fmt.Sprintf("KV transfer incomplete: %d of %d prompt tokens arrived for bootstrap_room %d.", n, p, it.boot.room))
	}
	// Decode writes what arrived; the rest of its reserved pages keep whatever their last
	// writer left there.
	out := s.writeAndGenerate(it, self, pages, n, p, o)
	if !out.failed() && n < p {
		s.logf("LEAK rid=%s read %d stale slots of %d; foreign requests: %s", it.rid, p-n, p, joinRIDs(out.gen.foreign))
	}
	return out
}

var errTransferTimeout = errors.New("transfer timed out")

// pullRoom asks the prefill's bootstrap port for a room, waiting at most
// the transfer timeout; an abort of ctx (abort_request) ends it at once.
func (s *Server) pullRoom(ctx context.Context, host string, port int, room uint64) (*roomData, error) {
	tctx, cancel := context.WithTimeout(ctx, s.cfg.TransferTimeout)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/room/" + strconv.FormatUint(room, 10) +
		"?wait_ms=" + strconv.FormatInt(s.cfg.TransferTimeout.Milliseconds(), 10)
	req, err := http.NewRequestWithContext(tctx, "GET", url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.pullClient.Do(req)
	if err != nil {
		if tctx.Err() == context.DeadlineExceeded {
			return nil, errTransferTimeout
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == 404 {
		return nil, errTransferTimeout
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("bootstrap server answered %d: %s", resp.StatusCode, body)
	}
	var w roomWire
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("decoding room: %w", err)
	}
	return &roomData{ids: w.IDs, promptLen: w.PromptLen, aborted: w.Aborted, status: w.Status, msg: w.Message, rid: w.RID}, nil
}

// idTexts gives input_ids a text so the model can quote them: cl100k
// decodes, chunk4 ids are hashes and are shown as "<id>".
func (s *Server) idTexts(ids []uint32) []string {
	texts := make([]string, len(ids))
	if c, ok := s.tok.Tokenizer.(cl100kTok); ok {
		for i, id := range ids {
			t, err := c.c.Decode([]uint{uint(id)})
			if err != nil {
				t = "<" + strconv.FormatUint(uint64(id), 10) + ">"
			}
			texts[i] = t
		}
		return texts
	}
	for i, id := range ids {
		texts[i] = "<" + strconv.FormatUint(uint64(id), 10) + ">"
	}
	return texts
}

// tokenDelay sleeps between generated tokens, or returns early on abort.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
