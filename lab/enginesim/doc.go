// Package enginesim is an SGLang-compatible inference engine simulator with a
// paged KV pool that really reproduces the prefill/decode disaggregation
// leak: pages are never zeroed on release, every token slot remembers the
// request that last wrote it, and a deterministic "model" answers by quoting
// runs of the slots its request reads. It owns its pool, its allocator and
// its HTTP surface (/generate, the OpenAI chat, completions and responses
// routes, Anthropic's /v1/messages, the prefill-only embedding, rerank,
// score and classify routes, /tokenize and /detokenize, SGLang's operator
// routes, /server_info, /metrics, the PD bootstrap port) and the leak
// experiments' engine model.
//
// It must never import any gateway package (config, tokenize, policy,
// backends, gateway, canary): it is the adversary the gateway is tested
// against, so it shares no code with it, not even the tokenizer choice
// (chunk4 exists so the gateway meets a tokenizer it does not share).
package enginesim
