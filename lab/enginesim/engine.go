package enginesim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"github.com/kvgate/kvgate/lab/enginesim/pdxfer"
	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

// outcome is the result of running one item. pages stay held until the
// reply is done, then the caller releases them.
type outcome struct {
	status       int
	msg          string
	errType      string
	promptTokens int
	gen          kvmodel.GenOut
	pages        []int32
	finish       string // "length", "stop" or "abort"
	self         *kvmodel.Writer
	cached       int // prompt tokens found in the prefix cache
	// The batch slot it holds while its reply runs, and what the advisories' bugs need
	// (advisories.go).
	slot      int
	prompt    string
	budget    int
	forcedOut bool // its reasoning-end string went to another request (forced-reasoning-end)
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

// The error envelopes of the three API families, for an outcome.
func writeGenerateError(ctx *fasthttp.RequestCtx, o *outcome) {
	wire.WriteGenerateError(ctx, o.status, o.msg)
}
func writeOpenAIError(ctx *fasthttp.RequestCtx, o *outcome) {
	wire.WriteOpenAIError(ctx, o.status, o.errType, o.msg)
}
func writeAnthropicError(ctx *fasthttp.RequestCtx, o *outcome) {
	wire.WriteAnthropicError(ctx, o.status, o.msg)
}

// checkLengths applies SGLang's three input checks in its order (the
// tokenizer manager's context and total checks, then the scheduler's pool
// check) and returns the failing reason and message.
func (s *Server) checkLengths(p, o int, oGiven bool, mril int) (reason, msg string) {
	ctxLen := s.cfg.ContextLength
	if p >= ctxLen {
		return "context", fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", p, ctxLen)
	}
	if oGiven && p+o >= ctxLen {
		return "total", fmt.Sprintf("Requested token count exceeds the model's maximum context length of %d tokens. "+
			"You requested a total of %d tokens: %d tokens from the input messages and %d tokens for the completion. "+
			"Please reduce the number of tokens in the input messages or the completion to fit within the limit.", ctxLen, p+o, p, o)
	}
	if p >= mril {
		return "pool", fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens). "+
			"Use a shorter input or enable --allow-auto-truncate.", p, mril)
	}
	return "", ""
}

// run tokenizes, checks, allocates, transfers (PD) and generates one item.
func (s *Server) run(ctx context.Context, it *wire.Item) *outcome {
	if it.IDs == nil {
		it.IDs, it.Texts = s.tok.Encode(it.Prompt)
		if s.cfg.Bug == kvmodel.BugTemplateDrift {
			it.IDs, it.Texts = s.driftPreamble(it.IDs, it.Texts)
		}
	} else if it.Texts == nil {
		it.Texts = s.idTexts(it.IDs)
	}
	p := len(it.IDs)
	s.countPrompt(p)
	if p == 0 {
		s.reject("empty")
		return errOutcome(400, "The input is empty: at least one token is required.")
	}
	if !it.MaxNewGiven && s.cfg.FillContext {
		it.MaxNew = max(s.cfg.ContextLength-1-p, 0)
	}
	reason, msg, status := s.checkInput(p, it.MaxNew, it.MaxNewGiven)
	stub := false
	if reason != "" {
		if reason == "pool" && s.cfg.Mode == ModePrefill && s.cfg.Bug == kvmodel.BugAdmitRejected && s.cfg.Fix != kvmodel.FixRejectAtAdmission {
			// The affected versions store the rejection in a pending field,
			// swap the prompt for a one-token stub and admit it anyway.
			stub = true
			s.reject("pool_admitted_stub")
			s.logf("BUG rid=%s prompt=%d >= max_req_input_len=%d: admitted as a one-token stub", it.RID, p, s.mril)
		} else {
			s.reject(reason)
			if s.cfg.Mode == ModePrefill && it.Boot.Has {
				s.rooms.Abort(it.Boot.Room, status, msg)
			}
			return errOutcome(status, msg)
		}
	}
	self := &kvmodel.Writer{RID: it.RID, Tenant: it.Tenant}
	var out *outcome
	switch s.cfg.Mode {
	case ModePrefill:
		out = s.runPrefill(ctx, it, self, p, stub)
	case ModeDecode:
		out = s.runDecode(ctx, it, self, p)
	default:
		out = s.runCombined(ctx, it, self, p)
	}
	if !out.failed() && !stub {
		out.cached = s.prefix.admit(it.Salt, it.IDs)
	}
	return out
}

// driftPreamble puts the tokens of bug template-drift before a text prompt's: a preamble the
// engine's template renders that the gateway's model of the prompt lacks (token-id prompts
// are not rendered, so they get none).
func (s *Server) driftPreamble(ids []uint32, texts []string) ([]uint32, []string) {
	unitIDs, unitTexts := s.tok.Encode(" drift")
	if len(unitIDs) == 0 || s.cfg.DriftTokens == 0 {
		return ids, texts
	}
	outIDs := make([]uint32, 0, s.cfg.DriftTokens+len(ids))
	outTexts := make([]string, 0, s.cfg.DriftTokens+len(ids))
	for len(outIDs) < s.cfg.DriftTokens {
		outIDs, outTexts = append(outIDs, unitIDs[0]), append(outTexts, unitTexts[0])
	}
	return append(outIDs, ids...), append(outTexts, texts...)
}

// genLen caps the output so prompt plus output fit the pool.
func (s *Server) genLen(p, want int) int {
	if room := s.pool.Tokens() - p; want > room {
		return max(room, 0)
	}
	return want
}

func (s *Server) pagesFor(tokens int) int { return (tokens + s.cfg.PageSize - 1) / s.cfg.PageSize }

func (s *Server) runCombined(ctx context.Context, it *wire.Item, self *kvmodel.Writer, p int) *outcome {
	o := s.genLen(p, it.MaxNew)
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
func (s *Server) writeAndGenerate(it *wire.Item, self *kvmodel.Writer, pages []int32, n, p, o int) *outcome {
	s.mu.Lock()
	v := &kvmodel.SeqView{Pool: s.pool, Pages: pages, Self: self}
	for i := 0; i < n; i++ {
		v.Write(i, it.IDs[i], it.Texts[i])
	}
	out := s.generateLocked(v, p, o)
	if !out.failed() {
		out.self = self
		budget := it.ThinkBudget
		if budget == 0 {
			budget = s.cfg.ThinkBudget
		}
		s.takeSlot(out, self, it.Texts[:p], budget)
	}
	s.mu.Unlock()
	if out.failed() {
		s.releasePages(pages)
		return out
	}
	out.pages, out.promptTokens = pages, p
	return out
}

// generateLocked runs the model; the ownership fix refuses first. s.mu held.
func (s *Server) generateLocked(v *kvmodel.SeqView, p, o int) *outcome {
	if s.cfg.Fix == kvmodel.FixOwnershipTags {
		if _, unowned := v.ContextReport(p); unowned {
			s.reject("ownership")
			return errOutcome(500, fmt.Sprintf("KV ownership check failed: request %s would read KV slots it does not own.", v.Self.RID))
		}
	}
	g := v.Generate(p, o, s.rng, s.padID, s.padText)
	finish := "length"
	if len(g.IDs) < o {
		finish = "stop"
	}
	return &outcome{status: 200, gen: g, finish: finish}
}

func (s *Server) runPrefill(ctx context.Context, it *wire.Item, self *kvmodel.Writer, p int, stub bool) *outcome {
	written := p
	if stub {
		written = 1
	}
	// Prefill computes the prompt's KV and one token; max_new_tokens is
	// forced to 1 whatever the body asked for.
	pages, err := s.allocPages(ctx, s.pagesFor(written+1))
	if err != nil {
		s.reject("no_pages")
		if it.Boot.Has {
			s.rooms.Abort(it.Boot.Room, 503, err.Error())
		}
		return errOutcome(503, err.Error())
	}
	s.mu.Lock()
	v := &kvmodel.SeqView{Pool: s.pool, Pages: pages, Self: self}
	for i := 0; i < written; i++ {
		v.Write(i, it.IDs[i], it.Texts[i])
	}
	out := s.generateLocked(v, written, 1)
	s.mu.Unlock()
	if out.failed() {
		s.releasePages(pages)
		if it.Boot.Has {
			s.rooms.Abort(it.Boot.Room, out.status, out.msg)
		}
		return out
	}
	out.promptTokens, out.self = written, self
	out.finish = "length"
	if it.Boot.Has {
		// The room keeps the pages until decode pulls it or it expires.
		s.rooms.Put(it.Boot.Room, &pdxfer.RoomData{IDs: append([]uint32(nil), it.IDs[:written]...), PromptLen: p, RID: it.RID},
			func() { s.releasePages(pages) }, s.cfg.RoomTTL)
	} else {
		out.pages = pages
	}
	return out
}

func (s *Server) runDecode(ctx context.Context, it *wire.Item, self *kvmodel.Writer, p int) *outcome {
	if !it.Boot.Has {
		s.reject("bad_request")
		return errOutcome(400, "Decode mode requires bootstrap_host, bootstrap_port and bootstrap_room.")
	}
	if !pdxfer.LoopbackHost(it.Boot.Host) {
		s.reject("bootstrap_host")
		return errOutcome(400, fmt.Sprintf("bootstrap_host %q is not a loopback address; the simulator only transfers KV over loopback.", it.Boot.Host))
	}
	port := it.Boot.Port
	if port == 0 {
		port = s.cfg.BootstrapPort
	}
	o := s.genLen(p, it.MaxNew)
	// Decode reserves pages for the whole prompt, whatever arrives. SGLang preallocates them
	// before the transfer; the simulator takes them once the room is ready, so that a decode
	// waiting for its KV never holds pages that another request's prefill waits for (two full
	// pools would otherwise wait on each other until the transfer timeout).
	rd, err := s.pull.Pull(ctx, it.Boot.Host, port, it.Boot.Room)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, pdxfer.ErrTransferTimeout) {
			s.reject("aborted")
			return &outcome{status: 200, finish: "abort", msg: "Abort request", self: self, promptTokens: p}
		}
		s.reject("transfer_timeout")
		return errOutcome(500, fmt.Sprintf("KV transfer for bootstrap_room %d failed: %v", it.Boot.Room, err))
	}
	if rd.Aborted {
		s.reject("aborted_by_prefill")
		return errOutcome(rd.Status, rd.Msg)
	}
	pages, err := s.allocPages(ctx, s.pagesFor(p+o))
	if err != nil {
		s.reject("no_pages")
		return errOutcome(503, err.Error())
	}
	n := min(len(rd.IDs), p)
	if s.cfg.Fix == kvmodel.FixDecodeLengthCheck && n < p {
		s.releasePages(pages)
		s.reject("decode_length")
		return errOutcome(400, fmt.Sprintf("KV transfer incomplete: %d of %d prompt tokens arrived for bootstrap_room %d.", n, p, it.Boot.Room))
	}
	// Decode writes what arrived; the rest of its reserved pages keep whatever their last
	// writer left there.
	out := s.writeAndGenerate(it, self, pages, n, p, o)
	if !out.failed() && n < p {
		s.logf("LEAK rid=%s read %d stale slots of %d; foreign requests: %s", it.RID, p-n, p, kvmodel.JoinRIDs(out.gen.Foreign))
	}
	return out
}

// idTexts gives input_ids a text so the model can quote them: cl100k
// decodes, chunk4 ids are hashes and are shown as "<id>".
func (s *Server) idTexts(ids []uint32) []string {
	texts := make([]string, len(ids))
	if d, ok := s.tok.Tokenizer.(kvmodel.Decoder); ok {
		for i, id := range ids {
			t, err := d.Decode([]uint32{id})
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
