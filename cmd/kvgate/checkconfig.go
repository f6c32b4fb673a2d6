package main

import (
	"fmt"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/config"
)

const checkConfigUsage = `usage: kvgate check-config [--config PATH]

Validates the configuration as kvgate serve would load it (the file, then KVGATE_* environment
variables, then defaults) without contacting anything, and prints the effective configuration as
YAML with secrets redacted (canary.secret, backends[].api_key, a Redis URL's password).
Exit status: 0 valid, 2 invalid (every error names its field, on stderr).

flags:
`

func runCheckConfig(args []string) int {
	fs := newFlags("check-config")
	if code, done := parseFlags(fs, checkConfigUsage, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvgate check-config: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	path := fs.Lookup("config").Value.String()
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvgate check-config: %s is not valid:\n%v\n", path, err)
		return 2
	}
	out, err := yaml.Marshal(cfg.Redacted())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvgate check-config:", err)
		return 1
	}
	fmt.Printf("# %s is valid; the effective configuration (secrets redacted):\n%s", path, out)
	return 0
}
