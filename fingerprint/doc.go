// Package fingerprint finds another tenant's prompt text in a reply.
//
// When a prompt is forwarded, the gateway keeps a sample of keyed hashes of its text (Sample),
// per tenant and per backend, in a bounded Index of this replica. As a reply streams, a Scanner
// hashes its text the same way and counts the fingerprints that belong to another tenant's
// recent prompt sent to a backend on the reply's path, that are not in the requester's own
// prompt, and that fewer than Config.CommonTenants tenants sent (a shared system prompt, a
// licence text, popular code): Config.CutMatches such fingerprints are a leak.
//
// Text is folded first, as the canary detector reads a marker (canary.FoldByte and FoldUnit, one
// table for both): case, compatibility forms and look-alikes folded, HTML references and \u
// escapes read, separators (white space, dashes, dots, format characters, combining marks)
// skipped; prompts and replies alike, so a disguised quote matches the plain prompt. A shingle is
// Shingle consecutive folded characters. Its keyed hash is a Karp–Rabin rolling
// hash modulo 2^61−1 with a secret base (so the sampling is keyed too), then SipHash-2-4 of that
// value under a key derived from the canary secret with HMAC-SHA256: a PRF per fingerprint at the
// cost of one short SipHash, where HMAC-SHA256 per shingle would cost about 1 µs.
//
// Sampling is winnowing (Schleimer, Wilkerson, Aiken 2003) with a window of Window shingles: the
// smallest hash of every Window consecutive shingles is kept. Any shared run of at least
// Guaranteed = Shingle+Window−1 folded characters therefore holds a window whose minimum the
// prompt kept; the reply side hashes every shingle (replies are short), so such a run always
// yields a common fingerprint. About 2/(Window+1) of a prompt's positions are kept.
//
// Domains is the same detector partitioned by KV domain (an engine, by default): a leaked prompt
// can only come out of the KV cache of an engine that served it, so each partition keeps about
// twice its engine's pool of distinct text, and a reply is checked against its route's
// partitions. Public text (licence texts and notices, code skeletons, legal preambles: public/)
// is common text in every partition.
//
// The package is pure: no I/O, no HTTP, no clock except the times it is given.
package fingerprint
