package main

import (
	"fmt"
	"os"
)

func runDemo(args []string) int {
	fmt.Fprintln(os.Stderr, "kvgate demo: not built yet")
	return 1
}
