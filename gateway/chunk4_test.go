package gateway_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testkit"
)

// chunk4Count is the simulator's chunk4 tokenizer on ASCII words separated by single spaces:
// each space is a token, each word is cut into pieces of at most 4 bytes.
func chunk4Count(ws []string) int {
	n := len(ws) - 1 // spaces
	for _, w := range ws {
		n += (len(w) + 3) / 4
	}
	return n
}

func randomWord(rng *rand.Rand) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 1+rng.Intn(11))
	for i := range b {
		b[i] = letters[rng.Intn(len(letters))]
	}
	return string(b)
}

// Against an engine whose tokenizer the gateway does not share (chunk4 counts far more tokens
// than cl100k on the same text), 1,000 prompts whose engine count lies within ±5% of the limit:
// the gateway must never admit one that the engine then rejects for length.
func TestNoAdmitTheEngineRejectsWithForeignTokenizer(t *testing.T) {
	sim := testkit.StartSim(t, "--mode", "combined", "--tokenizer", "chunk4", "--pool-tokens", "2048", "--context-length", "4096")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("", [3]string{"sim", sim.URL, "unified"})))
	const limit = 2041 // max_req_input_len 2042 − 1; max_new_tokens 1 keeps P + O under the context
	rng := rand.New(rand.NewSource(2026))
	counts := map[string]int{}
	for i := 0; i < 1000; i++ {
		target := int(float64(limit) * (0.95 + 0.10*rng.Float64()))
		var ws []string
		for chunk4Count(ws) < target {
			ws = append(ws, randomWord(rng))
		}
		text := strings.Join(ws, " ")
		engineCount := chunk4Count(ws)
		if i < 10 { // the local formula must be the engine's
			r := post(t, sim.URL, "/tokenize", "", fmt.Sprintf(`{"prompt":%q}`, text))
			var tk struct{ Count int }
			if json.Unmarshal(r.body, &tk) != nil || tk.Count != engineCount {
				t.Fatalf("chunk4 formula %d disagrees with the engine's /tokenize: %s", engineCount, r.body)
			}
		}
		r := post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":1}}`, text))
		fits := engineCount <= limit
		switch {
		case r.status == 413 && fits:
			counts["refused_but_fit"]++
		case r.status == 413:
			counts["refused"]++
		case r.status == 200 && fits:
			counts["admitted"]++
		case r.status == 200:
			t.Fatalf("admitted a %d-token prompt over the %d limit and the engine served it anyway? %s", engineCount, limit, r.body)
		default:
			t.Fatalf("prompt of %d engine tokens: gateway admitted and the engine answered %d %s", engineCount, r.status, r.body)
		}
		counts["tier_"+r.header.Get("X-Kvgate-Tier")]++
	}
	if counts["admitted"] == 0 || counts["refused"] == 0 {
		t.Fatalf("the band should give both outcomes: %v", counts)
	}
	if st := sim.Stats(t); len(st.Rejected) != 0 {
		t.Fatalf("the engine rejected requests the gateway admitted: %v", st.Rejected)
	}
	t.Logf("outcomes: %v", counts)
}
