package main

import (
	"fmt"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/config"
)

const checkConfigUsage = `usage: kvgate check [--config PATH]   (or kvgate check-config)

Validates the configuration as kvgate serve would load it (the file, then KVGATE_* environment
variables and their _FILE forms, then defaults) without contacting anything, and prints the
effective configuration as YAML with secrets redacted (canary.secret, backends[].api_key, a
Redis URL's password).
Exit status: 0 valid (warnings, such as a /metrics no key can read, on stderr), 2 invalid (every
error names its key or variable, on stderr).

flags:
`

// runCheckConfig is kvgate check (name says which of its two names was used, for messages).
func runCheckConfig(name string, args []string) int {
	fs := newFlags(name)
	if code, done := parseFlags(fs, checkConfigUsage, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvgate %s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	path := fs.Lookup("config").Value.String()
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvgate %s: %s is not valid:\n%v\n", name, path, err)
		return 2
	}
	out, err := yaml.Marshal(cfg.Redacted())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvgate "+name+":", err)
		return 1
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(os.Stderr, "kvgate %s: warning: %s\n", name, w)
	}
	fmt.Printf("# %s is valid; the effective configuration (secrets redacted):\n%s", path, out)
	return 0
}
