package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
)

// goList runs go list with args from the module root and returns its output.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	root, err := procs.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return string(out)
}

// The product binary links no lab package (the simulator serves other tenants' data by design)
// and no test helper.
func TestProductLinksNoLab(t *testing.T) {
	out := goList(t, "-deps", "./cmd/kvgate")
	deps := strings.Fields(out)
	if len(deps) < 10 || !strings.Contains(out, "github.com/kvgate/kvgate/gateway") {
		t.Fatalf("go list printed no plausible dependency list: %q", out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/kvgate/kvgate/lab") || strings.HasPrefix(d, "github.com/kvgate/kvgate/tests/testkit") {
			t.Errorf("the product binary links %s", d)
		}
	}
}

// The simulator shares no gateway code: of the product's packages it links only the leaf
// libraries that read a model's files as an engine serving it reads them: its tokenizer
// (tokenize/hf on tokenize/bpe), for --tokenizer hf:DIR, and its image processor's rule with
// the image headers it is applied to (tokenize/vision, tokenize/imagesize).
func TestSimulatorSharesOnlyTheTokenizerLibrary(t *testing.T) {
	out := goList(t, "-deps", "./lab/enginesim/...")
	if !strings.Contains(out, "github.com/kvgate/kvgate/lab/enginesim") {
		t.Fatalf("go list printed no plausible dependency list: %q", out)
	}
	for _, d := range strings.Fields(out) {
		p, ok := strings.CutPrefix(d, "github.com/kvgate/kvgate/")
		if !ok || strings.HasPrefix(p, "lab/") || p == "tokenize/hf" || p == "tokenize/bpe" ||
			p == "tokenize/vision" || p == "tokenize/imagesize" {
			continue
		}
		t.Errorf("the simulator links %s", d)
	}
}

// Test helpers stay in tests: no package's non-test code imports the test tree (tests/...), and
// the tests of the leaf packages and of the simulator link no gateway (their helpers do not climb
// back up the house).
func TestNoPackageImportsTestkit(t *testing.T) {
	out := goList(t, "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", "./...")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list listed %d packages", len(lines))
	}
	const tree = "github.com/kvgate/kvgate/tests/"
	for _, l := range lines {
		pkg, imports, _ := strings.Cut(l, ": ")
		if strings.HasPrefix(pkg, tree) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if strings.HasPrefix(imp, tree) {
				t.Errorf("%s imports %s outside its tests", pkg, imp)
			}
		}
	}
	for _, leaf := range []string{"./tokenize/...", "./lab/enginesim/...", "./canary", "./fingerprint", "./request", "./reply", "./apierr", "./internal/..."} {
		deps := goList(t, "-test", "-deps", leaf)
		if !strings.Contains(deps, "github.com/kvgate/kvgate/") {
			t.Fatalf("go list -test -deps %s printed no plausible list: %.200q", leaf, deps)
		}
		for _, d := range strings.Fields(deps) {
			if d == "github.com/kvgate/kvgate/gateway" || d == "github.com/kvgate/kvgate/tests/testkit" {
				t.Errorf("the tests of %s link %s", leaf, d)
			}
		}
	}
}

// The reply path is bytes in, bytes out: it links no HTTP server library, so it can be fuzzed
// and reasoned about on its own.
func TestReplyPathLinksNoFasthttp(t *testing.T) {
	out := goList(t, "-deps", "./reply")
	if !strings.Contains(out, "github.com/kvgate/kvgate/canary") {
		t.Fatalf("go list printed no plausible dependency list: %q", out)
	}
	if strings.Contains(out, "valyala/fasthttp") {
		t.Fatal("package reply links fasthttp")
	}
}
