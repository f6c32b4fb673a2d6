package canary

import "strings"

// FindMarkerFragments returns the live complete markers of which text contains a "KVG-"
// followed by at least FragmentMin characters that begin them (a whole marker included), each
// once, in order of first appearance (nil if none). ASCII letter case is ignored, in the prefix
// and the characters, so that a fragment written in capitals is still found; and, as Loose
// reads replies, LooseMin folded characters anywhere that begin a marker count without a prefix.
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
	return k.appendLooseEchoes(out, text)
}

// appendLooseEchoes adds the live markers whose first LooseMin characters appear in text as
// Loose reads it (case, fullwidth and invisible characters folded, no prefix needed): a reply
// repeating them would otherwise be a Loose hit, so they are the client's echoes too.
func (k *Keyring) appendLooseEchoes(out []string, text string) []string {
	b := []byte(text)
	var run []byte
	k.mu.RLock()
	defer k.mu.RUnlock()
	check := func() {
		for w := 0; w+LooseMin <= len(run); w++ {
			first, ok := k.byPrefix[prefixKey(run[w:])]
			if !ok {
				continue
			}
			for _, e := range append([]entry{first}, k.overflow[prefixKey(run[w:])]...) {
				if string(e.rest[:LooseMin-FragmentMin]) != string(run[w+FragmentMin:w+LooseMin]) {
					continue
				}
				m := MarkerPrefix + string(run[w:w+FragmentMin]) + string(e.rest[:])
				dup := false
				for _, o := range out {
					dup = dup || o == m
				}
				if !dup {
					out = append(out, m)
				}
			}
		}
		run = run[:0]
	}
	for i := 0; i < len(b); {
		c, skip, size := fold(b[i:])
		switch {
		case skip:
		case c == 0:
			check()
		default:
			run = append(run, c)
		}
		i += size
	}
	check()
	return out
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
