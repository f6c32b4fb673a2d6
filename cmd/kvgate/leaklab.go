package main

import (
	"fmt"
	"os"
)

func runLeaklab(args []string) int {
	fmt.Fprintln(os.Stderr, "kvgate leaklab: not built yet")
	return 1
}
