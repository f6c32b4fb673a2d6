// Package enginesim is an SGLang-compatible inference engine simulator with a
// paged KV pool that really reproduces the prefill/decode disaggregation
// leak. It is the HTTP server: its configuration, listeners and routing
// (/generate, the OpenAI chat, completions and responses routes, Anthropic's
// /v1/messages, the prefill-only embedding, rerank, score and classify
// routes, /tokenize and /detokenize, SGLang's operator routes,
// /server_info, /metrics, /sim/stats, the PD bootstrap port), the engine
// loop that admits, allocates, transfers and generates for each request
// (with the bug and its fixes), the route handlers, fast mode and the
// counters of /sim/stats.
//
// Its parts, each a package of its own:
//   - kvmodel: the pool, allocator, tokenizers and the deterministic model
//     (pages are never zeroed on release; the model quotes the slots its
//     request reads);
//   - wire: request decoding and reply rendering for every route;
//   - pdxfer: the KV transfer between a prefill and a decode server.
//
// None of them may import any gateway package (gateway, request, apierr,
// state, canary, policy, backends, tokenize, config): the simulator is the
// adversary the gateway is tested against, so it shares no code with it, not
// even the tokenizer choice (chunk4 exists so the gateway meets a tokenizer
// it does not share). The one exception is the library that reads a model's
// tokenizer files (tokenize/hf, on tokenize/bpe), for --tokenizer hf:DIR: an
// engine serving that model tokenizes with those files, and the library is
// checked against Hugging Face's own tokenizer and Jinja, not against the
// gateway (TestSimulatorSharesOnlyTheTokenizerLibrary).
package enginesim
