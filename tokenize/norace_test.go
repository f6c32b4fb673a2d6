//go:build !race

package tokenize

const raceSlowdown = 1

// sized returns the corpus size a test uses; see race_test.go.
func sized(n int) int { return n }
