package deploy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/config"
)

// exampleEnv is the environment the examples' headers say their secrets come from.
var exampleEnv = []string{
	"KVGATE_CANARY_SECRET=an-example-secret-of-32-characters",
	"KVGATE_ADMIN_KEY_SHA256=5a5746f7df6ee3d7ced19e5c3623457179b5b6bd4b01ca1644b80ff0d88d3b84",
}

// Every example config loads through kvgate's own validation, so the examples stay true as the
// configuration changes.
func TestExamplesValidate(t *testing.T) {
	files, _ := filepath.Glob("../examples/*.yaml")
	if len(files) < 2 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		cfg, err := config.Load(f, exampleEnv)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if filepath.Base(f) == "production.yaml" {
			if cfg.Listen != "0.0.0.0:8080" || !cfg.Canary.Enabled || cfg.State.RedisURL == "" || len(cfg.Backends) < 2 ||
				!cfg.Policy.Strict || cfg.Server.MetricsAuth != config.MetricsAuthAdmin {
				t.Errorf("production.yaml is not a production setup: %+v", cfg.Redacted())
			}
			served := map[string]bool{}
			for _, b := range cfg.Backends {
				served[b.Model] = true
			}
			if len(cfg.Models) != 2 || !served[cfg.Models[0].Name] || !served[cfg.Models[1].Name] {
				t.Errorf("production.yaml should serve two models, each with its engines: models %+v", cfg.Models)
			}
			var limited int
			for _, tn := range cfg.Tenants {
				if tn.RPM > 0 || tn.TPM > 0 || tn.MaxConcurrent > 0 {
					limited++
				}
			}
			if limited != len(cfg.Tenants) || limited == 0 {
				t.Errorf("production.yaml: %d of %d tenants have limits", limited, len(cfg.Tenants))
			}
		}
	}
}

// The image listens on every interface, runs as non-root and reports the version it was built
// as; the build context leaves out bin/, .git and caches. (CI has no Docker engine to build it:
// these are the lines that make those true.)
func TestReleaseKit(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	df := read("../Dockerfile")
	for _, want := range []string{`-X main.version=${VERSION}`, "ARG VERSION", "USER nonroot", "ENV KVGATE_LISTEN=0.0.0.0:8080", "EXPOSE 8080"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// The variable the image sets is a real setting.
	var c config.Config
	if err := config.ApplyEnv(&c, []string{"KVGATE_LISTEN=0.0.0.0:8080"}); err != nil || c.Listen != "0.0.0.0:8080" {
		t.Fatalf("KVGATE_LISTEN: %v %q", err, c.Listen)
	}
	ignored := map[string]bool{}
	for _, l := range strings.Split(read("../.dockerignore"), "\n") {
		ignored[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{".git", "bin/", ".cache/"} {
		if !ignored[want] {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
	mk := read("../Makefile")
	if !strings.Contains(mk, "--build-arg VERSION=$(VERSION)") {
		t.Error("make docker does not pass the version")
	}
	lic := []byte(read("../LICENSE"))
	if !bytes.Contains(lic, []byte("Apache License\n                           Version 2.0, January 2004")) ||
		!bytes.Contains(lic, []byte("END OF TERMS AND CONDITIONS")) || len(lic) < 11000 {
		t.Errorf("LICENSE is not the Apache-2.0 text (%d bytes)", len(lic))
	}
}

// The README's first screen (everything before its first section) fits a screen (40 lines of at
// most 100 characters), names the two commands, and points at production and the docs.
func TestReadmeFirstScreen(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	first, _, found := strings.Cut(string(b), "\n## ")
	if !found {
		t.Fatal("README has no sections")
	}
	lines := strings.Split(first, "\n")
	if len(lines) > 40 {
		t.Errorf("the first screen is %d lines", len(lines))
	}
	for i, l := range lines {
		if len([]rune(l)) > 100 {
			t.Errorf("line %d is %d characters", i+1, len([]rune(l)))
		}
	}
	for _, want := range []string{"make demo", "make test", "deploy/helm/kvgate", "examples/production.yaml", "/admin/ui/", "docs/lab.md", "docs/deploy.md"} {
		if !strings.Contains(first, want) {
			t.Errorf("the first screen does not mention %s", want)
		}
	}
	for _, f := range []string{"../docs/lab.md", "../docs/deploy.md", "../examples/production.yaml", "../CHANGELOG.md", "helm/kvgate/Chart.yaml"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the README points at %s: %v", f, err)
		}
	}
}
