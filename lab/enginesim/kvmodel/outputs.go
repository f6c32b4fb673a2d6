package kvmodel

import (
	"encoding/binary"
	"hash/fnv"
	"math"
)

// What the model answers on the prefill-only routes: deterministic
// functions of the prompt's token ids, so a test can predict them.

// EmbedDims is the length of the simulator's embedding vectors.
const EmbedDims = 8

// ClassifyLabels is the simulated classifier's id2label.
var ClassifyLabels = []string{"LABEL_0", "LABEL_1"}

// Vector is a deterministic unit vector of n floats from the prompt's ids.
func Vector(ids []uint32, n int) []float64 {
	h := fnv.New64a()
	var b [4]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:], id)
		h.Write(b[:])
	}
	x := h.Sum64()
	out := make([]float64, n)
	norm := 0.0
	for i := range out {
		// splitmix64 steps spread one hash over n values.
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		out[i] = float64(z>>11)/float64(1<<53)*2 - 1
		norm += out[i] * out[i]
	}
	norm = math.Sqrt(norm)
	for i := range out {
		out[i] = math.Round(out[i]/norm*1e6) / 1e6
	}
	return out
}

// UnitScore maps a prompt to a score in (0, 1).
func UnitScore(ids []uint32) float64 { return math.Round((Vector(ids, 1)[0]+1)/2*1e6) / 1e6 }

// Softmax normalises v to probabilities, rounded to 6 decimals.
func Softmax(v []float64) []float64 {
	out := make([]float64, len(v))
	m, sum := math.Inf(-1), 0.0
	for _, x := range v {
		m = max(m, x)
	}
	for i, x := range v {
		out[i] = math.Exp(x - m)
		sum += out[i]
	}
	for i := range out {
		out[i] = math.Round(out[i]/sum*1e6) / 1e6
	}
	return out
}
