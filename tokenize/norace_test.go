//go:build !race

package tokenize

const raceSlowdown = 1
