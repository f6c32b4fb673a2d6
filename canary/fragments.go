package canary

// FindMarkerFragments returns what text (a requester's own prompt) holds of live markers, read as
// Loose reads replies (any disguise, any offset, either direction): one echo descriptor per
// marker of which text holds a run of at least HoldMin characters, in order of first
// appearance (nil if none). A descriptor is "KVG-" and the marker's 20 characters with every
// character the text did not hold replaced by '?'; a whole marker is its own descriptor.
//
// The gateway hands them to the reply's scanners as the requester's echoes: a model that repeats
// what the client itself sent (say 12 characters of another tenant's marker) is echoing, not
// leaking, and must not get backends quarantined. Only those characters are an echo: any other
// character of the marker in the reply is foreign (a tenant that sends part of a victim's marker
// does not shield later leaks of the rest).
func (k *Keyring) FindMarkerFragments(text string) []string {
	type found struct {
		rec  int
		body [MarkerChars]byte
		mask uint32
	}
	var order []found
	l := &Loose{k: k, tenant: "\x00"}
	l.collect = func(rec, lo, n int) {
		span := uint32(1)<<uint(lo+n) - uint32(1)<<uint(lo)
		for i := range order {
			if order[i].rec == rec {
				order[i].mask |= span
				return
			}
		}
		order = append(order, found{rec, l.r.recs[rec].body, span})
	}
	l.feed(nil, []byte(text), true, false)
	if len(order) == 0 {
		return nil
	}
	out := make([]string, 0, len(order))
	for _, f := range order {
		var d [MarkerLen]byte
		copy(d[:], MarkerPrefix)
		for i := 0; i < MarkerChars; i++ {
			d[len(MarkerPrefix)+i] = '?'
			if f.mask&(1<<i) != 0 {
				d[len(MarkerPrefix)+i] = f.body[i]
			}
		}
		out = append(out, string(d[:]))
	}
	return out
}
