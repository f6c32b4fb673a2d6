// Command kvgate-lab is the lab: the engine simulator (sim), which reproduces the disaggregation
// leak and so serves other tenants' data by design, the leak experiments (leaklab) and the
// walkthrough (demo). It is never shipped: the product binary, cmd/kvgate, links no lab package.
package main

import (
	"fmt"
	"os"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `usage: kvgate-lab <command> [flags]

commands:
  demo      start a leaking PD simulator pair and a gateway in front, and show the difference
  sim       run an SGLang-compatible engine simulator
  leaklab   run the leak experiments in process
  fairness  the admission-queue experiment: a flooded engine through 1, 2, 4 kvgate replicas
  version   print the version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	switch cmd {
	case "demo":
		code = runDemo(args)
	case "sim":
		code = runSim(args)
	case "leaklab":
		code = runLeaklab(args)
	case "fairness":
		code = runFairness(args)
	case "version", "--version", "-version":
		fmt.Println("kvgate-lab", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "kvgate-lab: unknown command %q\n\n%s", cmd, usage)
		code = 2
	}
	os.Exit(code)
}
