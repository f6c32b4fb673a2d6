package fingerprint

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The shipped public text: licence texts and the notices put at the top of files (Apache 2.0,
// MIT, BSD, ISC, GPL, LGPL, MPL, …), well-known code skeletons and legal preambles. A model
// knows these by heart and tenants paste them; when fewer than CommonTenants tenants sent one
// recently it would otherwise be taken for another tenant's prompt (two tenants paste the
// Apache header, a third asks for it and loses its reply). Every shingle of them is common text
// in every partition from the start, never evicted.
//
//go:embed public/*.txt
var shipped embed.FS

// PublicTexts are the shipped public texts, by file name (public/*.txt).
func PublicTexts() map[string]string {
	out := map[string]string{}
	entries, _ := fs.ReadDir(shipped, "public")
	for _, e := range entries {
		b, _ := shipped.ReadFile("public/" + e.Name())
		out[strings.TrimSuffix(e.Name(), ".txt")] = string(b)
	}
	return out
}

// LoadPublicDir reads the operator's public texts: every *.txt file in dir (field names the
// configuration field for errors).
func LoadPublicDir(field, dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	slices.Sort(names)
	texts := make([]string, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		texts = append(texts, string(b))
	}
	return texts, nil
}

// Shingles appends to dst the fingerprint of every shingle of text (not a sample): what a
// reply quoting any part of it hashes.
func (h *Hasher) Shingles(dst []uint64, text string) []uint64 {
	r := roller{h: h}
	r.feed(text, 0, true, func(v uint64, _ int) { dst = append(dst, h.final(v)) })
	return dst
}

// AddPublic makes every shingle of texts common text in every partition, for good; it returns
// how many fingerprints were new.
func (d *Domains) AddPublic(texts ...string) int {
	var fps []uint64
	n := 0
	for _, t := range texts {
		fps = d.h.Shingles(fps[:0], t)
		d.wmu.Lock()
		parts := *d.parts.Load()
		for _, fp := range fps {
			fp = key(fp)
			sh := &d.shards[fp&(shardCount-1)]
			if sh.full() {
				sh.rebuild(d.liveness())
			}
			if d.insertPinned(sh, fp) {
				parts[boilerplatePart].total++
				n++
			}
		}
		d.wmu.Unlock()
	}
	return n
}
