// Package kvmodel is the simulated engine's memory and model, without HTTP:
// the paged KV pool and its allocator policies (pages are never zeroed on
// release, and every token slot remembers the request that last wrote it),
// the two tokenizers (cl100k and chunk4), the deterministic model that
// answers by quoting runs of the slots its request reads, its outputs for
// the prefill-only routes, and the leak's vocabulary (bugs, fixes, SGLang's
// max_req_input_len). The HTTP simulator (lab/enginesim) and the page-level
// leak experiments (lab/leaklab) both run on it.
//
// Like the rest of lab/enginesim it imports no gateway package.
package kvmodel
