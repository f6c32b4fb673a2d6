package main

import (
	"context"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tests/procs"
)

// `kvgate demo --once` is what `make demo` shows: it must print both lines and exit 0.
func TestDemoOnce(t *testing.T) {
	bin := procs.LabBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "demo", "--once").CombinedOutput()
	if err != nil {
		t.Fatalf("demo --once: %v\n%s", err, out)
	}
	direct := regexp.MustCompile(`(?m)^direct: HTTP 200 foreign_markers=([0-9]+)$`).FindSubmatch(out)
	if direct == nil || string(direct[1]) == "0" {
		t.Fatalf("want the engine to answer 200 with foreign markers:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^gateway: HTTP 413 context_length_exceeded$`).Match(out) {
		t.Fatalf("want the gateway's 413 line:\n%s", out)
	}
}
