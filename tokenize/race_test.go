//go:build race

package tokenize

// The race detector slows counting about tenfold: time bounds scale up and corpora shrink (still
// spanning several 64 KiB chunks, so the parallel path runs), keeping the package's tests short.
const raceSlowdown = 10

func sized(n int) int { return min(n, 256<<10) }
