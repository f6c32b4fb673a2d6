// Command kvgate is the one binary of the project: the gateway (serve), the
// walkthrough (demo), the engine simulator (sim), the leak experiments
// (leaklab) and the deployment audit (audit). It only parses flags and wires
// packages together.
package main

import (
	"fmt"
	"os"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `usage: kvgate <command> [flags]

commands:
  serve     run the gateway (kvgate serve --config PATH)
  demo      start a leaking PD simulator pair and a gateway in front, and show the difference
  sim       run an SGLang-compatible engine simulator
  leaklab   run the leak experiments in process
  audit     test a deployment's refusal path and isolation from outside (kvgate audit --target URL)
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
	case "serve":
		code = runServe(args)
	case "demo":
		code = runDemo(args)
	case "sim":
		code = runSim(args)
	case "leaklab":
		code = runLeaklab(args)
	case "audit":
		code = runAudit(args)
	case "version", "--version", "-version":
		fmt.Println("kvgate", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "kvgate: unknown command %q\n\n%s", cmd, usage)
		code = 2
	}
	os.Exit(code)
}
