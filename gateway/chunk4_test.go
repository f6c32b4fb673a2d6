package gateway_test

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
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
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "chunk4", "--pool-tokens", "2048", "--context-length", "4096")
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

// proseWords are common English words: cl100k gives about one token per word, chunk4 (a
// space is a token, words are cut into pieces of at most 4 bytes) about 2.7 times as many.
var proseWords = strings.Fields(`the of and to in is that for it as was with be by on not he this are or
his from at which but have an they you were her she there been one all would their we him when who
more will no if out so said what up its about into than them can only other new some could time these
two may then do first any my now such like our over man me even most made after also did many before
must through back years where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between both life being under
never day same another know while last might great old year off come since against go came right used
take three himself few house use during without again place around however home small found thought
went say part once general high upon school every does got united left number course war until always
away something fact though water less public put think almost hand enough far took head yet government
system better set told nothing night end why called didn't eyes find going look asked later knew point
next program city business give group toward young days let room president side social present given
several order national possible rather second face per among form important often things looking early
white case john become large big need four within felt along children saw best church ever least power
development light thing seemed family interest want members mind country area others done turned although
open problem sense service certain kind began different door thus help means whole period matter perhaps
itself york times law human line above name example action company hands local show whether five history
gave today either act feet across taken past quite anything seen having death experience body word half
really week field car words already themselves information tell together college shall money period held
keep sure probably free seems political real behind cannot miss question air office making brought whose
special major heard problems ago became federal moment study available known result street economic boy
reason change south board individual job society areas west close turn love community true court force
full seem am wife age policy voice stood`)

// prose is n words of English-like text (a sentence break every so often) and its chunk4 count.
func prose(rng *rand.Rand, target int) (string, int) {
	var ws []string
	for chunk4Count(ws) < target {
		w := proseWords[rng.Intn(len(proseWords))]
		if rng.Intn(12) == 0 {
			w += "."
		}
		ws = append(ws, w)
	}
	return strings.Join(ws, " "), chunk4Count(ws)
}

// Enforce mode, a real chunk4 simulator, English prose (where chunk4 counts ~2.7 × cl100k, far
// over the safety ratio) whose engine count lies within ±10% of max_req_input_len: the engine
// must never receive a prompt over its limit (/sim/stats: no length rejection, largest prompt
// under the limit), and prompts that fit must still be admitted.
func TestChunk4ProseNeverOverMaxReqInputLen(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--tokenizer", "chunk4", "--pool-tokens", "4096", "--context-length", "16384")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("policy: {mode: enforce}\n", [3]string{"sim", sim.URL, "unified"})))
	const mril = 4090 // min(16383, 4095) − 5
	rng := rand.New(rand.NewSource(12))
	counts := map[string]int{}
	for i := 0; i < 300; i++ {
		text, n := prose(rng, int(float64(mril)*(0.9+0.2*rng.Float64())))
		r := post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":1}}`, text))
		switch {
		case r.status == 200 && n >= mril:
			t.Fatalf("admitted a prompt of %d engine tokens, limit %d", n, mril)
		case r.status == 200:
			counts["admitted"]++
		case r.status == 413 && n < mril:
			counts["refused_but_fit"]++
		case r.status == 413:
			counts["refused"]++
		default:
			t.Fatalf("%d engine tokens: %d %s", n, r.status, r.body)
		}
		counts["tier_"+r.header.Get("X-Kvgate-Tier")]++
	}
	st := sim.Stats(t)
	if len(st.Rejected) != 0 || st.MaxPromptTokens >= mril {
		t.Fatalf("the engine received prompts over its limit: max_prompt_tokens=%d rejected=%v", st.MaxPromptTokens, st.Rejected)
	}
	if counts["admitted"] == 0 || counts["refused"] == 0 || counts["refused_but_fit"] != 0 {
		t.Fatalf("exact counts should decide the band both ways, and never refuse a fit: %v", counts)
	}
	t.Logf("outcomes: %v, max prompt the engine saw: %d", counts, st.MaxPromptTokens)
}

// Two paths, only one with a foreign tokenizer: a cl100k unified engine with a small pool, and a
// chunk4 PD pair with a large one. The gateway must count each path with that path's engines:
// an exact count from the cl100k engine (listed first) says nothing about what the chunk4 pair
// will count. No engine may receive a prompt over its own max_req_input_len.
func TestChunk4TwoPathsOnlyOneForeign(t *testing.T) {
	plain := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "2048", "--context-length", "16384", "--page-size", "16")
	pre := procs.StartSim(t, "--mode", "prefill", "--tokenizer", "chunk4", "--pool-tokens", "8192", "--context-length", "16384", "--page-size", "16", "--bootstrap-port", "0", "--bug", "admit-rejected")
	dec := procs.StartSim(t, "--mode", "decode", "--tokenizer", "chunk4", "--pool-tokens", "8192", "--context-length", "16384", "--page-size", "16")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("policy: {mode: enforce}\n",
		[3]string{"plain", plain.URL, "unified"}, [3]string{"p4", pre.URL, "prefill"}, [3]string{"d4", dec.URL, "decode"})))
	const plainMRIL, pdMRIL = 2042, 8186
	rng := rand.New(rand.NewSource(5))
	counts := map[string]int{}
	for i := 0; i < 200; i++ {
		// Engine (chunk4) counts from 4,000 (the cl100k engine may take these) to 9,500.
		text, n := prose(rng, 4000+rng.Intn(5500))
		var r reply
		if i%2 == 0 {
			r = post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":1}}`, text))
		} else {
			r = post(t, gw.URL, "/v1/completions", tenantKey, fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, text))
		}
		switch r.status {
		case 200:
			counts["admitted"]++
		case 413:
			counts["refused"]++
		default:
			t.Fatalf("chunk4 count %d: %d %s", n, r.status, r.body)
		}
		if r.status == 200 && n >= pdMRIL && r.header.Get("X-Sim-Foreign-Requests") == "" {
			counts["over_pd_limit_admitted_to_plain"]++
		}
	}
	for name, s := range map[string]*procs.Sim{"plain": plain, "prefill": pre, "decode": dec} {
		st := s.Stats(t)
		limit := pdMRIL
		if name == "plain" {
			limit = plainMRIL
		}
		if len(st.Rejected) != 0 || st.MaxPromptTokens >= limit {
			t.Fatalf("%s received a prompt over its limit %d: max_prompt_tokens=%d rejected=%v", name, limit, st.MaxPromptTokens, st.Rejected)
		}
		counts["served_by_"+name] = st.Requests["/generate"] + st.Requests["/v1/completions"]
	}
	if counts["admitted"] == 0 || counts["refused"] == 0 || counts["served_by_prefill"] == 0 {
		t.Fatalf("both outcomes and the chunk4 pair should all occur: %v", counts)
	}
	t.Logf("outcomes: %v", counts)
}

// A PD pair whose decode tokenizes differently from its prefill (cl100k prefill, chunk4 decode):
// calibration tells them apart, so the exact count is asked of both and the larger decides; the
// decode never receives a prompt over its max_req_input_len.
func TestChunk4PairWithForeignDecode(t *testing.T) {
	pre := procs.StartSim(t, "--mode", "prefill", "--pool-tokens", "8192", "--context-length", "16384", "--page-size", "16", "--bootstrap-port", "0")
	// No decode reservation (issue 39): the decode's max_req_input_len, not its preallocation
	// edge (pool − num_reserved_decode_tokens), is the limit this test is about.
	dec := procs.StartSim(t, "--mode", "decode", "--tokenizer", "chunk4", "--pool-tokens", "4096", "--context-length", "16384", "--page-size", "16",
		"--num-reserved-decode-tokens", "0")
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, gatewayYAML("policy: {mode: enforce}\n",
		[3]string{"p", pre.URL, "prefill"}, [3]string{"d4", dec.URL, "decode"})))
	const mril = 4090 // the pair's: min(8186, 4090)
	rng := rand.New(rand.NewSource(9))
	counts := map[string]int{}
	for i := 0; i < 120; i++ {
		text, n := prose(rng, int(float64(mril)*(0.9+0.2*rng.Float64())))
		r := post(t, gw.URL, "/generate", tenantKey, fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":1}}`, text))
		switch {
		case r.status == 200 && n >= mril:
			t.Fatalf("admitted %d decode tokens over %d", n, mril)
		case r.status == 200:
			counts["admitted"]++
		case r.status == 413:
			counts["refused"]++
		default:
			t.Fatalf("%d decode tokens: %d %s", n, r.status, r.body)
		}
	}
	if st := dec.Stats(t); len(st.Rejected) != 0 || st.MaxPromptTokens >= mril {
		t.Fatalf("decode received a prompt over its limit: max_prompt_tokens=%d rejected=%v", st.MaxPromptTokens, st.Rejected)
	}
	if counts["admitted"] == 0 || counts["refused"] == 0 {
		t.Fatalf("want both outcomes: %v", counts)
	}
	t.Logf("outcomes: %v", counts)
}
