package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testkit"
)

// The product binary links no lab package (the simulator serves other tenants' data by design)
// and no test helper.
func TestProductLinksNoLab(t *testing.T) {
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "./cmd/kvgate")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 || !strings.Contains(string(out), "github.com/kvgate/kvgate/gateway") {
		t.Fatalf("go list printed no plausible dependency list: %q", out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/kvgate/kvgate/lab") || strings.HasPrefix(d, "github.com/kvgate/kvgate/internal/testkit") {
			t.Errorf("the product binary links %s", d)
		}
	}
}

// Test helpers stay in tests: no package's non-test code imports internal/testkit.
func TestNoPackageImportsTestkit(t *testing.T) {
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list listed %d packages", len(lines))
	}
	for _, l := range lines {
		pkg, imports, _ := strings.Cut(l, ": ")
		if strings.Contains(" "+imports+" ", " github.com/kvgate/kvgate/internal/testkit ") {
			t.Errorf("%s imports internal/testkit outside its tests", pkg)
		}
	}
}

// The reply path is bytes in, bytes out: it links no HTTP server library, so it can be fuzzed
// and reasoned about on its own.
func TestReplyPathLinksNoFasthttp(t *testing.T) {
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "./reply")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	if !strings.Contains(string(out), "github.com/kvgate/kvgate/canary") {
		t.Fatalf("go list printed no plausible dependency list: %q", out)
	}
	if strings.Contains(string(out), "valyala/fasthttp") {
		t.Fatal("package reply links fasthttp")
	}
}
