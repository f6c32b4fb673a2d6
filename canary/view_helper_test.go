package canary

import (
	"bytes"
	"strings"
)

// readView is out as a reader decodes it (readUnit): each character's classes, separators
// dropped, a space for anything that breaks a run.
func readView(out []byte) []byte {
	var v []byte
	for i := 0; i < len(out); {
		reading, sep, size, _ := readUnit(out[i:], true)
		switch {
		case reading != "":
			v = append(v, reading...)
		case !sep:
			v = append(v, ' ')
		}
		i += size
	}
	return v
}

// classes is a marker body in classes (as readView writes them).
func classes(body string) []byte {
	b := []byte(strings.ToLower(body))
	for i, c := range b {
		if classIdx[c] >= 0 {
			b[i] = b32alphabet[classIdx[c]]
		}
	}
	return b
}

// reversed returns b backwards.
func reversed(b []byte) []byte {
	r := make([]byte, len(b))
	for i, c := range b {
		r[len(b)-1-i] = c
	}
	return r
}

// bodyRun is the longest run of consecutive characters of the marker's body, from any offset and
// in either direction, that a reader recovers from out: what reached the client of it.
func bodyRun(out []byte, marker string) int {
	view := readView(out)
	body := classes(marker[len(MarkerPrefix):])
	best := 0
	for _, b := range [][]byte{body, reversed(body)} {
		for off := 0; off < len(b); off++ {
			for n := len(b) - off; n > best; n-- {
				if bytes.Contains(view, b[off:off+n]) {
					best = n
					break
				}
			}
		}
	}
	return best
}

// foldedLeak is bodyRun (the old name: the longest run of the victim's characters a reader
// recovers).
func foldedLeak(out []byte, marker string) int { return bodyRun(out, marker) }

// prefixUpToRedacted says whether out, up to the first Redacted (where the detector began to
// withhold a run), is a prefix of text: nothing was changed or reordered before it.
func prefixUpToRedacted(text string, out []byte) bool {
	if i := bytes.Index(out, []byte(Redacted)); i >= 0 && !strings.Contains(text, Redacted) {
		out = out[:i]
	}
	return strings.HasPrefix(text, string(out))
}
