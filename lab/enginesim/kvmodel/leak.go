package kvmodel

// The leak's variants: the bug a server may carry and the fixes that stop
// it, shared by the HTTP simulator and the page-level experiments (leaklab).
const (
	BugNone          = "none"
	BugAdmitRejected = "admit-rejected" // prefill turns a pool rejection into an admitted one-token stub
	// BugTemplateDrift: the engine renders tokens the gateway does not model (a preamble its
	// chat template adds) before every text prompt, and reports the larger prompt_tokens.
	BugTemplateDrift = "template-drift"
	// BugSaltIgnored: the prefix cache ignores cache_salt (SGLang before sglang#23300), so a
	// prompt hits another salt's cached prefix.
	BugSaltIgnored = "salt-ignored"
	// BugSaltDroppedTier2: the first cache tier keys by the salt, the second (host memory, an
	// LMCache-style store written through on every prefill) drops it (LMCache#4825).
	BugSaltDroppedTier2 = "salt-dropped-tier2"
	// BugBatchSlotResidue (GHSA-v97p-wpxp-px84): a request starts decoding on the tokens the
	// batch slot's previous occupant sampled last, and its reply begins with them.
	BugBatchSlotResidue = "batch-slot-residue"
	// BugForcedReasoningEnd (GHSA-fpch-3xrf-7q96): a request that exhausts its
	// thinking_token_budget has the reasoning-end string forced into another running request's
	// output instead of its own.
	BugForcedReasoningEnd = "forced-reasoning-end"

	FixNone              = "none"
	FixRejectAtAdmission = "reject-at-admission" // prefill and decode answer 400, nothing is transferred
	FixZeroOnRelease     = "zero-on-release"     // released pages are cleared: stale slots read as nothing
	FixOwnershipTags     = "ownership-tags"      // reading a slot the request does not own is a 500
	FixDecodeLengthCheck = "decode-length-check" // decode refuses (400) a transfer shorter than the prompt
)

// MaxReqInputLen is SGLang's derivation: min(context−1, pool−1) − 5, with
// the pool already rounded down to a page multiple.
func MaxReqInputLen(poolTokens, pageSize, contextLength int) int {
	pool := poolTokens / pageSize * pageSize
	return min(contextLength-1, pool-1) - 5
}
