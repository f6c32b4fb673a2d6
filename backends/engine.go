package backends

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/internal/panics"
)

// post sends a small JSON body to one of the engine's control endpoints with the backend's key.
func (b *Backend) post(path string, body any, timeout time.Duration, resp *fasthttp.Response) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req.SetRequestURI(b.base + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
	}
	req.SetBodyRaw(raw)
	return b.ctl.DoTimeout(req, resp, timeout)
}

// Tokenize asks the engine for the exact token count of prompt (SGLang's /tokenize, the count
// of the engine's own tokenizer), special tokens included: the engine adds them to text prompts.
func (b *Backend) Tokenize(ctx context.Context, prompt string, timeout time.Duration) (int, error) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := b.post("/tokenize", map[string]any{"prompt": prompt, "add_special_tokens": true}, timeout, resp); err != nil {
		return 0, fmt.Errorf("tokenize on %s: %w", b.Name, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return 0, fmt.Errorf("tokenize on %s: status %d", b.Name, resp.StatusCode())
	}
	n, err := decodeTokenizeCount(resp.Body())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", b.Name, err)
	}
	return n, nil
}

// decodeTokenizeCount reads /tokenize's count, an engine number that admission rests on: an
// integer literal from 0 to maxCapacity in "count", or the length of "tokens" (a list of
// integers); when both are given they must agree. Anything else is an error (no count), never 0.
func decodeTokenizeCount(body []byte) (int, error) {
	var out map[string]json.RawMessage
	if err := json.Unmarshal(body, &out); err != nil || out == nil {
		return 0, fmt.Errorf("tokenize: reply is not a JSON object")
	}
	n, err := optInt(out, "count", 0, -1)
	if err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	if raw, ok := out["tokens"]; ok && !isNull(raw) {
		var toks []json.Number
		if err := json.Unmarshal(raw, &toks); err != nil {
			return 0, fmt.Errorf("tokenize: tokens is not a list of numbers")
		}
		if n >= 0 && n != len(toks) {
			return 0, fmt.Errorf("tokenize: count %d disagrees with %d tokens", n, len(toks))
		}
		n = len(toks)
	}
	if n < 0 {
		return 0, fmt.Errorf("tokenize: no count")
	}
	return n, nil
}

// Detokenize asks the engine for the text of token ids (SGLang's /detokenize, with the engine's
// own vocabulary): what a model reading those ids can repeat.
func (b *Backend) Detokenize(ctx context.Context, ids []int, timeout time.Duration) (string, error) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := b.post("/detokenize", map[string]any{"tokens": ids, "skip_special_tokens": false}, timeout, resp); err != nil {
		return "", fmt.Errorf("detokenize on %s: %w", b.Name, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return "", fmt.Errorf("detokenize on %s: status %d", b.Name, resp.StatusCode())
	}
	var out struct {
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(resp.Body(), &out); err != nil || out.Text == nil {
		return "", fmt.Errorf("detokenize on %s: no text in the reply", b.Name)
	}
	return *out.Text, nil
}

// Abort asks the engine to drop request rid (SGLang's /abort_request). It runs in the
// background, bounded by timeout: an abort must never hold up the client.
func (b *Backend) Abort(rid string, timeout time.Duration) {
	go func() {
		defer panics.Recover(b.log, "abort")
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		_ = b.post("/abort_request", map[string]any{"rid": rid, "abort_all": false}, timeout, resp)
	}()
}

// CallReply is a whole reply of a small engine call.
type CallReply struct {
	Status      int
	ContentType []byte
	Body        []byte
}

// maxCallReply bounds a utility reply held whole (a tokenize reply lists every token id).
const maxCallReply = 64 << 20

// Call posts a JSON body to path on the engine (the control client: utility routes such as
// /v1/tokenize) and returns the whole reply, bounded in time and size.
func (b *Backend) Call(path string, body []byte, timeout time.Duration) (*CallReply, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(b.base + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.Header.Set("Accept-Encoding", "identity")
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
	}
	req.SetBodyRaw(body)
	resp.SkipBody = false
	if err := b.ctl.DoTimeout(req, resp, timeout); err != nil {
		return nil, err
	}
	raw, err := resp.BodyUncompressed()
	if err != nil {
		return nil, fmt.Errorf("decoding the reply: %w", err)
	}
	if len(raw) > maxCallReply {
		return nil, fmt.Errorf("reply larger than %d bytes", maxCallReply)
	}
	return &CallReply{Status: resp.StatusCode(), ContentType: append([]byte(nil), resp.Header.ContentType()...),
		Body: append([]byte(nil), raw...)}, nil
}
