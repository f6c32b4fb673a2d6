package fingerprint

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The shipped public text is common from the start: each of at least 50 texts, sent by two
// tenants on an engine (inside a question of their own), then asked for by a third on that
// engine, gives no cut. Without the shipped set the same replies are cut: the test can fail.
func TestPublicTextIsCommonFromTheStart(t *testing.T) {
	now := time.Unix(1e9, 0)
	texts := PublicTexts()
	if len(texts) < 50 {
		t.Fatalf("%d shipped public texts, want at least 50", len(texts))
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range texts {
			if !yield(n) {
				return
			}
		}
	})
	run := func(d *Domains) (cuts int, cutNames []string) {
		for i, name := range names {
			engine := fmt.Sprintf("e%d", i%8)
			for _, tenant := range []string{"alice", "bob"} {
				keepIn(d, tenant, []string{engine}, "Please review this for me:\n"+texts[name]+"\nThanks, "+tenant, now)
			}
			sc := d.NewScanner("carol", []string{engine}, nil)
			if sc.Feed("Sure, here it is:\n" + texts[name]) {
				cuts++
				cutNames = append(cutNames, name)
			}
		}
		return cuts, cutNames
	}
	if cuts, which := run(newTestDomains(DomainsConfig{})); cuts != 0 {
		t.Fatalf("%d of %d public texts cut: %v", cuts, len(names), which)
	}
	without, _ := run(newTestDomains(DomainsConfig{NoShippedPublicText: true}))
	if without < len(names)*9/10 {
		t.Fatalf("without the shipped set only %d of %d replies cut: the corpus does not test it", without, len(names))
	}
	// The Apache header case of the issue, verbatim.
	d := newTestDomains(DomainsConfig{})
	for _, tenant := range []string{"alice", "bob"} {
		keepIn(d, tenant, []string{"e1"}, "// "+texts["notice-apache-2.0"], now)
	}
	if cut, _ := leaks(d, "carol", []string{"e1"}, texts["notice-apache-2.0"]); cut {
		t.Fatal("the Apache header cut")
	}
}

// The operator's public texts, from a directory, are common too; a missing directory is an
// error naming the field.
func TestOperatorPublicText(t *testing.T) {
	now := time.Unix(1e9, 0)
	dir := t.TempDir()
	house := words(77, 300)
	if err := os.WriteFile(filepath.Join(dir, "house-style.txt"), []byte(house), 0o644); err != nil {
		t.Fatal(err)
	}
	texts, err := LoadPublicDir("canary.fingerprints.public_text_dir", dir)
	if err != nil || len(texts) != 1 {
		t.Fatalf("LoadPublicDir: %v %d", err, len(texts))
	}
	with, without := newTestDomains(DomainsConfig{PublicText: texts}), newTestDomains(DomainsConfig{})
	for _, d := range []*Domains{with, without} {
		keepIn(d, "alice", []string{"e1"}, house, now)
	}
	if cut, _ := leaks(with, "carol", []string{"e1"}, house); cut {
		t.Fatal("the operator's public text cut")
	}
	if cut, _ := leaks(without, "carol", []string{"e1"}, house); !cut {
		t.Fatal("without it, alice's text is not cut: the test cannot fail")
	}
	if _, err := LoadPublicDir("canary.fingerprints.public_text_dir", filepath.Join(dir, "nope")); err == nil {
		t.Fatal("missing directory accepted")
	}
}
