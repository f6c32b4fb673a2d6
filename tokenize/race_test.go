//go:build race

package tokenize

// The race detector slows counting several times; time bounds scale with it.
const raceSlowdown = 10
