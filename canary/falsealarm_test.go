package canary

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestFalseAlarmsOnNaturalText reads natural text from the machine (Go source, /usr/share/doc,
// man pages, locale data, logs) and base32 identifiers made from it (SHA-256 of every line),
// as replies to a tenant, against 10^5 live markers, and counts leaks (runs of LooseMin) and
// withheld runs (HoldMin to LooseMin−1). It takes minutes, so it runs only when
// KVGATE_FALSEALARM_BYTES is set (make falsealarm: 1 GB). The corpus is read again with a new
// marker set (a new secret) until the byte target is met: chance matches depend on the pairs of
// text and markers, so each pass is fresh evidence. The expected rates are in loose.go; the
// measured ones in SECURITY.md.
func TestFalseAlarmsOnNaturalText(t *testing.T) {
	target, _ := strconv.ParseFloat(os.Getenv("KVGATE_FALSEALARM_BYTES"), 64)
	if target <= 0 {
		t.Skip("set KVGATE_FALSEALARM_BYTES (make falsealarm) to run")
	}
	corpus := naturalCorpus(t)
	t.Logf("corpus: %d files, %.1f MB", len(corpus), float64(total(corpus))/1e6)
	const markers = 100_000
	tenants := make([]string, markers/26)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%06d", i)
	}
	var scanned int64
	leaks, withheld := 0, 0
	start := time.Now()
	for pass := 0; float64(scanned) < target; pass++ {
		k := NewKeyring([]byte(fmt.Sprintf("false alarm pass %d", pass)), time.Hour, 24*time.Hour, tenants)
		if pass == 0 {
			t.Logf("live markers: %d", k.LiveMarkers())
		}
		l := k.NewLoose("requester", nil)
		var dst []byte
		for _, doc := range corpus {
			l.Reset("requester", nil)
			for off := 0; off < len(doc); off += 4096 {
				end := min(off+4096, len(doc))
				for end < len(doc) && !utf8.RuneStart(doc[end]) {
					end++
				}
				var h *Hit
				dst, h = l.Feed(dst[:0], doc[off:end])
				withheld += bytes.Count(dst, []byte(Redacted)) - bytes.Count(doc[off:end], []byte(Redacted))
				if h != nil {
					leaks++
					t.Logf("false alarm: %+v", *h)
					l.Reset("requester", nil)
				}
				scanned += int64(end - off)
				off = end - 4096
				if float64(scanned) >= target {
					break
				}
			}
			if float64(scanned) >= target {
				break
			}
		}
	}
	gb := float64(scanned) / 1e9
	t.Logf("scanned %.3f GB in %v: %d leaks (%.4f per GB), %d withheld runs (%.0f per GB)",
		gb, time.Since(start).Round(time.Second), leaks, float64(leaks)/gb, withheld, float64(withheld)/gb)
	if leaks > 0 {
		t.Fatalf("%d false alarms on %.3f GB of natural text", leaks, gb)
	}
}

func total(docs [][]byte) int {
	n := 0
	for _, d := range docs {
		n += len(d)
	}
	return n
}

// naturalCorpus reads the machine's text: Go source and its test data (code, prose in comments,
// CJK and other scripts in tests), /usr/share/doc (prose, changelogs), man pages (gzipped
// roff), locale definitions, logs; and for every 64 lines one line of base32 identifiers (the
// SHA-256 of each line, as ids and hashes appear in logs).
func naturalCorpus(t *testing.T) [][]byte {
	var docs [][]byte
	enc := base32.StdEncoding.WithPadding(base32.NoPadding)
	add := func(b []byte) {
		if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
			return // binary
		}
		var ids strings.Builder
		lines := bytes.Split(b, []byte("\n"))
		for i, ln := range lines {
			sum := sha256.Sum256(ln)
			if i%4 == 0 {
				ids.WriteString("id=" + strings.ToLower(enc.EncodeToString(sum[:16])) + " ")
			}
		}
		docs = append(docs, b, []byte(ids.String()))
	}
	for _, root := range []string{"/usr/local/go/src", "/usr/local/go/doc", "/usr/share/doc", "/usr/share/man", "/usr/share/i18n", "/usr/share/common-licenses", "/var/log"} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			info, err := d.Info()
			if err != nil || !info.Mode().IsRegular() || info.Size() > 8<<20 {
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			var r io.Reader = f
			if strings.HasSuffix(p, ".gz") {
				zr, err := gzip.NewReader(f)
				if err != nil {
					return nil
				}
				r = io.LimitReader(zr, 8<<20)
			}
			b, err := io.ReadAll(r)
			if err == nil {
				add(b)
			}
			return nil
		})
	}
	if total(docs) < 50<<20 {
		t.Fatalf("only %d bytes of natural text on this machine", total(docs))
	}
	return docs
}
