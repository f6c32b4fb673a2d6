// Package fptest makes text for tests of prompt fingerprints.
package fptest

import (
	"math/rand/v2"
	"strings"
)

// Words is n made-up words drawn from rng: prose-like text that two draws share no long run of.
func Words(rng *rand.Rand, n int) string {
	syll := []string{"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qu", "dro", "fen", "gil", "hor"}
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		for j := 0; j < 1+rng.IntN(3); j++ {
			b.WriteString(syll[rng.IntN(len(syll))])
		}
	}
	return b.String()
}
