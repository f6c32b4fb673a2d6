// Command kvgate is the product binary: the gateway (serve) and the deployment
// audit (audit). It only parses flags and wires packages together. The
// simulator, the leak experiments and the demo are in cmd/kvgate-lab, which
// this binary never links (the simulator serves other tenants' data by design).
package main

import (
	"fmt"
	"os"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `usage: kvgate <command> [flags]

commands:
  serve         run the gateway (kvgate serve --config PATH)
  check         validate a configuration and print it with secrets redacted (kvgate check --config PATH;
                check-config is the same command)
  audit         test a deployment's refusal path and isolation from outside (kvgate audit --target URL)
  version       print the version

kvgate <command> --help describes a command.
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
	case "check", "check-config":
		code = runCheckConfig(cmd, args)
	case "demo", "sim", "leaklab":
		fmt.Fprintf(os.Stderr, "kvgate: %q is in the lab binary, not the product: run kvgate-lab %s (make demo builds it)\n", cmd, cmd)
		code = 2
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
