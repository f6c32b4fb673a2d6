package main

import (
	"fmt"
	"os"
)

func runServe(args []string) int {
	fmt.Fprintln(os.Stderr, "kvgate serve: not built yet")
	return 1
}
