// Package testkit holds test helpers that run the real kvgate binary: it
// builds ./cmd/kvgate once per test process, starts simulator processes on
// ephemeral loopback ports and stops them when the test ends. It owns nothing
// persistent, binds only to 127.0.0.1, and must never be imported by
// non-test code.
package testkit

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
	buildLog  []byte
)

// Binary returns the path of a kvgate binary. When the environment variable
// KVGATE_BIN names an existing file, that file is used as is (CI builds once
// for all packages). Otherwise ./cmd/kvgate is built once per test process
// into a temporary directory, from the module root found by walking up from
// the working directory to go.mod. A build failure fails the test.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KVGATE_BIN"); p != "" {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	buildOnce.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "kvgate-testbin-")
		if err != nil {
			buildErr = err
			return
		}
		out := filepath.Join(dir, "kvgate")
		cmd := exec.Command("go", "build", "-o", out, "./cmd/kvgate")
		cmd.Dir = root
		buildLog, buildErr = cmd.CombinedOutput()
		buildPath = out
	})
	if buildErr != nil {
		t.Fatalf("testkit: building kvgate: %v\n%s", buildErr, buildLog)
	}
	return buildPath
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
