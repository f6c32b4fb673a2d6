package policy

import "testing"

func TestIsolationRoutable(t *testing.T) {
	on, off := Isolation{RefuseShared: true}, Isolation{}
	for _, c := range []struct {
		iso      Isolation
		verdicts []string
		want     bool
	}{
		{off, []string{SaltShared}, true}, // off by default: nothing refused
		{off, []string{SaltShared, SaltShared}, true},
		{on, []string{SaltShared}, false},
		{on, []string{SaltIsolated}, true},
		{on, []string{SaltUnknown}, true},               // no figure is no evidence of sharing
		{on, []string{""}, true},                        // never audited
		{on, []string{SaltIsolated, SaltShared}, false}, // a PD path: prefill isolated, decode shared
		{on, []string{SaltShared, SaltIsolated}, false},
		{on, []string{SaltIsolated, SaltUnknown}, true},
		{on, nil, true},
	} {
		if got := c.iso.Routable(c.verdicts...); got != c.want {
			t.Errorf("%+v.Routable(%q) = %v, want %v", c.iso, c.verdicts, got, c.want)
		}
	}
}

func TestParseSaltVerdict(t *testing.T) {
	for _, s := range []string{SaltIsolated, SaltShared, SaltUnknown} {
		if v, err := ParseSaltVerdict(s); err != nil || v != s {
			t.Errorf("%q: %q %v", s, v, err)
		}
	}
	for _, s := range []string{"", "Shared", "isolated "} {
		if _, err := ParseSaltVerdict(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
