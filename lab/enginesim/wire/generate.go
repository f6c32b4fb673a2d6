package wire

// ---- /generate ----

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// defaultGenerateMaxNew is SGLang's sampling_params.max_new_tokens default.
const defaultGenerateMaxNew = 128

type samplingParams struct {
	MaxNewTokens *int `json:"max_new_tokens"`
}

type generateReq struct {
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	Stream         bool            `json:"stream"`
	RID            json.RawMessage `json:"rid"`
	BootstrapHost  json.RawMessage `json:"bootstrap_host"`
	BootstrapPort  json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom  json.RawMessage `json:"bootstrap_room"`
	CacheSalt      json.RawMessage `json:"cache_salt"`
	// ExtraKey is the native route's name for the prefix-cache salt.
	ExtraKey json.RawMessage `json:"extra_key"`
}

// ParseGenerate decodes a /generate body (single or batched) into its items;
// it also reports whether the body is a batch and whether it asks for a stream.
func ParseGenerate(env Env, body []byte) ([]*Item, bool, bool, error) {
	var req generateReq
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, false, false, Badf("invalid JSON body: %v", err)
	}
	salts, err := env.NoteSalt(req.CacheSalt, "cache_salt")
	if err != nil {
		return nil, false, false, err
	}
	// extra_key is the native name; SGLang's OpenAI routes turn cache_salt into it.
	keys, err := env.NoteSalt(req.ExtraKey, "extra_key")
	if err != nil {
		return nil, false, false, err
	}
	if keys != nil {
		salts = keys
	}
	texts, batchT, err := Strings(req.Text, "text")
	if err != nil {
		return nil, false, false, err
	}
	ids, batchI, err := IDLists(req.InputIDs, "input_ids")
	if err != nil {
		return nil, false, false, err
	}
	if (texts == nil) == (ids == nil) {
		return nil, false, false, Badf("exactly one of text and input_ids is required")
	}
	n := len(texts) + len(ids)
	batch := batchT || batchI
	if n == 0 {
		return nil, false, false, Badf("empty batch")
	}
	var sps []samplingParams
	if IsArray(req.SamplingParams) {
		if err := json.Unmarshal(req.SamplingParams, &sps); err != nil || len(sps) != n {
			return nil, false, false, Badf("sampling_params: a list must have one object per prompt")
		}
	} else if !IsNull(req.SamplingParams) {
		var sp samplingParams
		if err := json.Unmarshal(req.SamplingParams, &sp); err != nil {
			return nil, false, false, Badf("sampling_params: %v", err)
		}
		sps = []samplingParams{sp}
	}
	rids, _, err := Strings(req.RID, "rid")
	if err != nil {
		return nil, false, false, err
	}
	if len(rids) > 1 && len(rids) != n {
		return nil, false, false, Badf("rid: a list must have one id per prompt")
	}
	boots, err := bootFields(req.BootstrapHost, req.BootstrapPort, req.BootstrapRoom, n)
	if err != nil {
		return nil, false, false, err
	}
	items := make([]*Item, n)
	for i := range items {
		it := &Item{MaxNew: defaultGenerateMaxNew, MaxNewGiven: true, Boot: boots[i], Salt: SaltFor(salts, i)}
		if texts != nil {
			it.Prompt = texts[i]
		} else {
			it.IDs = ids[i]
		}
		if len(sps) > 0 {
			sp := sps[0]
			if len(sps) > 1 {
				sp = sps[i]
			}
			if sp.MaxNewTokens != nil {
				if *sp.MaxNewTokens < 0 {
					return nil, false, false, Badf("sampling_params.max_new_tokens must not be negative")
				}
				it.MaxNew = *sp.MaxNewTokens
			}
		}
		switch {
		case len(rids) == 1 && !batch:
			it.RID = rids[0]
		case len(rids) > 1:
			it.RID = rids[i]
		}
		if it.RID == "" {
			it.RID = env.NewRID()
		}
		items[i] = it
	}
	return items, batch, req.Stream, nil
}

// FinishObj is meta_info.finish_reason.
type FinishObj struct {
	Type    string `json:"type"`
	Length  int    `json:"length,omitempty"`
	Matched *int   `json:"matched,omitempty"`
	Message string `json:"message,omitempty"`
}

// GenMeta is a /generate reply's meta_info.
type GenMeta struct {
	ID               string     `json:"id"`
	FinishReason     *FinishObj `json:"finish_reason"`
	PromptTokens     int        `json:"prompt_tokens"`
	CompletionTokens int        `json:"completion_tokens"`
	// CachedTokens is the prompt's prefix found in the cache; nil when the engine reports none.
	CachedTokens *int `json:"cached_tokens,omitempty"`
}

// GenReply is one /generate reply (or stream event).
type GenReply struct {
	Text      string   `json:"text"`
	OutputIDs []uint32 `json:"output_ids"`
	MetaInfo  GenMeta  `json:"meta_info"`
	Index     *int     `json:"index,omitempty"`
}

// WriteGenerateError answers status in SGLang's native error shape.
func WriteGenerateError(ctx *fasthttp.RequestCtx, status int, msg string) {
	b, _ := Marshal(map[string]any{"error": map[string]any{"message": msg}})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
