package policy

import "fmt"

// Salt verdicts of a backend, as `kvgate audit` reports them (audit.Salt*).
const (
	SaltIsolated = "isolated"
	SaltShared   = "shared"
	SaltUnknown  = "unknown"
)

// Isolation is the routing rule on backends' salt verdicts (policy.isolation).
type Isolation struct {
	// RefuseShared keeps tenants' traffic off every path through a backend whose last verdict
	// is shared: its prefix cache lets one tenant's prompt hit another's. Fail closed: when no
	// path is left the request is refused (503), never sent to a shared backend. Off by default:
	// a verdict comes from an audit the operator runs, and an engine without a verdict is not
	// refused ("unknown" is routable: many engines report no cached tokens).
	RefuseShared bool
}

// Routable reports whether a path through backends with these verdicts ("" = never audited)
// may carry a tenant's traffic.
func (iso Isolation) Routable(verdicts ...string) bool {
	if !iso.RefuseShared {
		return true
	}
	for _, v := range verdicts {
		if v == SaltShared {
			return false
		}
	}
	return true
}

// ParseSaltVerdict checks a verdict read from outside (an audit's report, the admin API).
func ParseSaltVerdict(s string) (string, error) {
	switch s {
	case SaltIsolated, SaltShared, SaltUnknown:
		return s, nil
	}
	return "", fmt.Errorf("verdict %q is not isolated, shared or unknown", s)
}
