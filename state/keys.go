package state

// Keys is the one Redis key schema of kvgate. Every key starts with the configured prefix and
// carries the {kvgate} hash tag, so multi-key scripts run on Redis Cluster (all keys in one slot).
//
//	prefix{kvgate}:incidents               stream of incidents
//	prefix{kvgate}:quarantine:<backend>    one flag per backend, expiring (PX)
//	prefix{kvgate}:quarantined             set of flagged backend names
//	prefix{kvgate}:rl:<tenant>:r|:t|:c     request cell, token cell, concurrency leases
//	prefix{kvgate}:replicas                replica heartbeats
//	prefix{kvgate}:tenants                 run-time tenants (name → record)
//	prefix{kvgate}:tenant-keys             key hash → tenant name
//	prefix{kvgate}:tenants:version         bumped on every tenant write
//	prefix{kvgate}:prints                  stream of prompt fingerprint records (keyed hashes, no text)
type Keys struct{ Prefix string }

func (k Keys) base() string { return k.Prefix + "{kvgate}:" }

// Incidents is the incident stream.
func (k Keys) Incidents() string { return k.base() + "incidents" }

// Prints is the stream of prompt fingerprint records replicas share.
func (k Keys) Prints() string { return k.base() + "prints" }

// QuarantineFlag is backend's quarantine flag.
func (k Keys) QuarantineFlag(backend string) string { return k.base() + "quarantine:" + backend }

// Quarantined is the set of flagged backend names.
func (k Keys) Quarantined() string { return k.base() + "quarantined" }

// LimitCells are tenant's request cell, token cell and lease set, in that order.
func (k Keys) LimitCells(tenant string) []string {
	b := k.base() + "rl:" + tenant
	return []string{b + ":r", b + ":t", b + ":c"}
}

// Replicas is the replica heartbeat set.
func (k Keys) Replicas() string { return k.base() + "replicas" }

// Tenants are the tenant hash, the key index and the version counter, in that order.
func (k Keys) Tenants() []string {
	return []string{k.base() + "tenants", k.base() + "tenant-keys", k.base() + "tenants:version"}
}
