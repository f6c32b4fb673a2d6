package state

// Keys is the one Redis key schema of kvgate. Every key starts with the configured prefix (which
// holds no braces, see config) and carries a hash tag, so that every multi-key script or
// transaction touches one Redis Cluster slot, and the hot keys spread over the cluster:
//
//	prefix{rl:<tenant>}:r|:t|:c            one tenant's request cell, token cell and concurrency
//	                                       leases: one slot per tenant (every admission is one
//	                                       script on that slot), tenants spread over the masters
//	prefix{kvgate}:incidents               stream of incidents
//	prefix{kvgate}:quarantine:<backend>    one flag per backend, expiring (PX)
//	prefix{kvgate}:quarantined             set of flagged backend names
//	prefix{kvgate}:failclosed:<model>      one flag per model whose admission is fail-closed
//	prefix{kvgate}:failclosed              set of fail-closed model names
//	prefix{kvgate}:replicas                replica heartbeats
//	prefix{kvgate}:tenants                 run-time tenants (name → record)
//	prefix{kvgate}:tenant-keys             key hash → tenant name
//	prefix{kvgate}:tenants:version         bumped on every tenant write
//	prefix{kvgate}:prints                  stream of prompt fingerprint records (keyed hashes, no text)
//	prefix{kvp:<domain>}:prints            one KV domain's fingerprint stream: a slot per domain
//	prefix{kvgate}:text-evidence:<backend> prompt-text matches on a backend (requester, victim), by time
//	prefix{kvgate}:requester-quarantines:<tenant> quarantines a requester's matches triggered, expiring
//
// The {kvgate} keys are the control plane: written rarely (an incident, a quarantine, an admin
// call), read by one poll per replica a second, and changed together atomically (a flag with its
// set, a tenant with its key index and the version), so they share one slot on purpose. The per
// request traffic is the limit cells', and that is what the per-tenant tag spreads. A tenant name
// holding '}' ends its tag early: its cells still share one slot (they share the key up to the
// suffix), only that slot may then be another tenant's too.
type Keys struct{ Prefix string }

func (k Keys) base() string { return k.Prefix + "{kvgate}:" }

// Incidents is the incident stream.
func (k Keys) Incidents() string { return k.base() + "incidents" }

// Prints is the stream of prompt fingerprint records replicas share.
func (k Keys) Prints() string { return k.base() + "prints" }

// DomainPrints is one KV domain's fingerprint stream, in a slot of its own (its tag can never be
// the control plane's: it starts "kvp:").
func (k Keys) DomainPrints(domain string) string { return k.Prefix + "{kvp:" + domain + "}:prints" }

// TextEvidence is the prompt-text matches on backend (TextEvidence).
func (k Keys) TextEvidence(backend string) string { return k.base() + "text-evidence:" + backend }

// RequesterQuarantines counts the quarantines requester's matches triggered in a window.
func (k Keys) RequesterQuarantines(requester string) string {
	return k.base() + "requester-quarantines:" + requester
}

// QuarantineFlag is backend's quarantine flag.
func (k Keys) QuarantineFlag(backend string) string { return k.base() + "quarantine:" + backend }

// Quarantined is the set of flagged backend names.
func (k Keys) Quarantined() string { return k.base() + "quarantined" }

// FailClosedFlag is model's fail-closed admission flag (count drift).
func (k Keys) FailClosedFlag(model string) string { return k.base() + "failclosed:" + model }

// FailClosed is the set of fail-closed model names.
func (k Keys) FailClosed() string { return k.base() + "failclosed" }

// LimitCells are tenant's request cell, token cell and lease set, in that order, in the
// tenant's own slot.
func (k Keys) LimitCells(tenant string) []string {
	b := k.Prefix + "{rl:" + tenant + "}:"
	return []string{b + "r", b + "t", b + "c"}
}

// Replicas is the replica heartbeat set.
func (k Keys) Replicas() string { return k.base() + "replicas" }

// Tenants are the tenant hash, the key index and the version counter, in that order.
func (k Keys) Tenants() []string {
	return []string{k.base() + "tenants", k.base() + "tenant-keys", k.base() + "tenants:version"}
}
