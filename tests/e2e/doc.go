// Package e2e holds end-to-end tests that need no gateway internals: real simulator processes
// (tests/procs) and a real gateway on loopback (tests/testkit), talked to over HTTP like a
// client. It has no code of its own.
package e2e
