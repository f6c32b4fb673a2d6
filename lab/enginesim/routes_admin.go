package enginesim

import (
	"encoding/json"
	"fmt"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
	"github.com/kvgate/kvgate/lab/enginesim/wire"
	"github.com/valyala/fasthttp"
)

// maxPieces bounds the chunk4 detokenize table; past it, new pieces are
// not remembered and detokenize answers 400 for them.
const maxPieces = 1 << 20

// rememberPieces lets /detokenize invert chunk4, whose ids are hashes:
// every piece /tokenize hands out is recorded by id.
func (s *Server) rememberPieces(ids []uint32, texts []string) {
	if s.tok.Name() != "chunk4" {
		return
	}
	s.piecesMu.Lock()
	for i, id := range ids {
		if len(s.pieces) < maxPieces {
			s.pieces[id] = texts[i]
		}
	}
	s.piecesMu.Unlock()
}

// decode turns ids back into text with the server's tokenizer.
func (s *Server) decode(ids []uint32) (string, error) {
	if d, ok := s.tok.Tokenizer.(kvmodel.Decoder); ok {
		t, err := d.Decode(ids)
		if err != nil {
			return "", fmt.Errorf("tokens: %v", err)
		}
		return t, nil
	}
	s.piecesMu.Lock()
	defer s.piecesMu.Unlock()
	b := make([]byte, 0, len(ids)*3)
	for _, id := range ids {
		p, ok := s.pieces[id]
		if !ok {
			// Not one this server handed out: the text the model itself reads for it, so
			// that a gateway asking sees what a reply could quote.
			p = s.idTexts([]uint32{id})[0]
		}
		b = append(b, p...)
	}
	return string(b), nil
}

// handleDetokenize answers /detokenize and /v1/detokenize:
// {"tokens":[…]|[[…]]} → {"text":"…"|["…"]}.
func (s *Server) handleDetokenize(ctx *fasthttp.RequestCtx, path string) {
	s.countRequest(path)
	var req struct {
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeOpenAIError(ctx, errOutcome(400, "invalid JSON body: "+err.Error()))
		return
	}
	lists, batch, err := wire.IDLists(req.Tokens, "tokens")
	if err != nil || lists == nil {
		writeOpenAIError(ctx, errOutcome(400, "tokens: want a list of token ids or a list of lists"))
		return
	}
	texts := make([]string, len(lists))
	for i, l := range lists {
		if texts[i], err = s.decode(l); err != nil {
			writeOpenAIError(ctx, errOutcome(400, err.Error()))
			return
		}
	}
	if batch {
		wire.WriteJSON(ctx, map[string]any{"text": texts})
		return
	}
	wire.WriteJSON(ctx, map[string]any{"text": texts[0]})
}

// handleAdmin answers SGLang's operator routes with their success replies
// and does nothing else: they exist so a test can prove a gateway never
// lets a tenant reach them (each call is counted in /sim/stats).
func (s *Server) handleAdmin(ctx *fasthttp.RequestCtx, path string) {
	s.countRequest(path)
	s.logf("admin %s called", path)
	switch path {
	case "/flush_cache":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
	case "/start_profile":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("Start profiling.\n")
	case "/stop_profile":
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("Stop profiling. This will take some time.\n")
	default: // the /update_weights_* family
		wire.WriteJSON(ctx, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
	}
}
