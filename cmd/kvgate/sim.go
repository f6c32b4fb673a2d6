package main

import (
	"fmt"
	"os"
)

func runSim(args []string) int {
	fmt.Fprintln(os.Stderr, "kvgate sim: not built yet")
	return 1
}
