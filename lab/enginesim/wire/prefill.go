package wire

import "encoding/json"

// PoolReq holds the fields the prefill-only routes share.
type PoolReq struct {
	Model     string          `json:"model"`
	Input     json.RawMessage `json:"input"`
	Text      json.RawMessage `json:"text"`
	InputIDs  json.RawMessage `json:"input_ids"`
	Query     json.RawMessage `json:"query"`
	Documents []string        `json:"documents"`
	Items     json.RawMessage `json:"items"`
	TopN      *int            `json:"top_n"`
	// ReturnDocuments defaults to true, as in SGLang.
	ReturnDocuments *bool           `json:"return_documents"`
	LabelTokenIDs   []uint32        `json:"label_token_ids"`
	ApplySoftmax    bool            `json:"apply_softmax"`
	ItemFirst       bool            `json:"item_first"`
	CacheSalt       json.RawMessage `json:"cache_salt"`
}
