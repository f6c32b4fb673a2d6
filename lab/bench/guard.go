package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// runGuard runs argv in a process group of its own and ends that whole group when it is told
// to stop: by this program's stop (SIGTERM) or by the death of the bench itself (the guard's
// parent-death signal is SIGTERM, which it can catch). nginx needs it: its workers are
// grandchildren that a parent-death signal on the master would not reach.
func runGuard(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "guard: nothing to run")
		return 2
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "guard:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // leftovers of a master that exited
		if err != nil {
			fmt.Fprintln(os.Stderr, "guard:", err)
			return 1
		}
		return 0
	case <-sig:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return 0
}
