package canary

import "strings"

// FindMarkerFragments returns the live complete markers of which text contains a "KVG-"
// followed by at least FragmentMin characters that begin them (a whole marker included), each
// once, in order of first appearance (nil if none). ASCII letter case is ignored, in the prefix
// and the characters, so that a fragment written in capitals is still found.
//
// The gateway adds them to a request's echo set: a model that repeats a fragment the client
// itself sent (say 8 characters of another tenant's marker) is echoing, not leaking, and must
// not get backends quarantined. FindMarkers finds only complete markers.
func (k *Keyring) FindMarkerFragments(text string) []string {
	var out []string
	var run [MarkerChars]byte
	for i := 0; i < len(text); {
		d := strings.IndexByte(text[i:], '-')
		if d < 0 {
			break
		}
		d += i
		i = d + 1
		if d < 3 || lowerASCII(text[d-3]) != 'k' || lowerASCII(text[d-2]) != 'v' || lowerASCII(text[d-1]) != 'g' {
			continue
		}
		n := 0
		for n < MarkerChars && d+1+n < len(text) && b32val[lowerASCII(text[d+1+n])] >= 0 {
			run[n] = lowerASCII(text[d+1+n])
			n++
		}
		if n < FragmentMin {
			continue
		}
		i = d + 1 + n
		key := prefixKey(run[:])
		k.mu.RLock()
		first, ok := k.byPrefix[key]
		var cands []entry
		if ok {
			cands = append(append(cands, first), k.overflow[key]...)
		}
		k.mu.RUnlock()
		for _, e := range cands {
			m := MarkerPrefix + string(run[:FragmentMin]) + string(e.rest[:])
			dup := false
			for _, o := range out {
				dup = dup || o == m
			}
			if !dup {
				out = append(out, m)
			}
		}
	}
	return out
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
