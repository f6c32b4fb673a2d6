// Package procs holds test helpers that run the repository's real binaries: it builds
// ./cmd/kvgate and ./cmd/kvgate-lab (the simulator) once per test process, starts simulator
// processes on ephemeral loopback ports and stops them when the test ends. It links no gateway
// package, so the simulator's own tests can use it. It owns nothing persistent, binds only to
// 127.0.0.1, and is imported by tests only.
package procs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// built is one binary built once per test process.
type built struct {
	once sync.Once
	path string
	err  error
	log  []byte
}

var product, lab built

// Binary returns the path of the product binary, kvgate. When the environment
// variable KVGATE_BIN names an existing file, that file is used as is (CI
// builds once for all packages). Otherwise ./cmd/kvgate is built once per test
// process into a temporary directory, from the module root found by walking up
// from the working directory to go.mod. A build failure fails the test.
func Binary(t testing.TB) string {
	t.Helper()
	return product.get(t, "KVGATE_BIN", "kvgate")
}

// LabBinary is Binary for the lab binary, kvgate-lab (simulator, leak lab,
// demo), with KVGATE_LAB_BIN in place of KVGATE_BIN.
func LabBinary(t testing.TB) string {
	t.Helper()
	return lab.get(t, "KVGATE_LAB_BIN", "kvgate-lab")
}

func (b *built) get(t testing.TB, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	b.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			b.err = err
			return
		}
		dir, err := os.MkdirTemp("", "kvgate-testbin-")
		if err != nil {
			b.err = err
			return
		}
		out := filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-buildvcs=auto", "-o", out, "./cmd/"+name)
		cmd.Dir = root
		b.log, b.err = cmd.CombinedOutput()
		b.path = out
	})
	if b.err != nil {
		t.Fatalf("testkit: building %s: %v\n%s", name, b.err, b.log)
	}
	return b.path
}

// ModuleRoot walks up from the working directory to the first directory
// that holds a go.mod file.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testkit: no go.mod above the working directory")
		}
		dir = parent
	}
}

// RepoRoot is the module root (ModuleRoot), failing the test when it cannot be found.
func RepoRoot(t testing.TB) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
