package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/tiktoken-go/tokenizer"

	"github.com/kvgate/kvgate/tokenize"
)

// The count phase: kvgate's counter (tokenize library "kvgate", cl100k_base) and tiktoken-go's
// Count on the same texts in one run, rounds interleaved, in MB/s of text counted. Texts are
// 448 KiB (a 128k-token prompt of prose): prose, code, Chinese, one repeated character, spaces.

// countResult is one text's figures (medians over the rounds).
type countResult struct {
	KvgateMBs     float64 `json:"kvgate_mb_s"`
	TiktokenGoMBs float64 `json:"tiktoken_go_mb_s"`
	Ratio         float64 `json:"ratio"`
	Bytes         int     `json:"bytes"`
	Tokens        int     `json:"tokens"`
}

var countTextOrder = []string{"prose", "code", "chinese", "onechar", "spaces"}

const countTextBytes = 448 << 10

func countTexts() map[string]string {
	r := rand.New(rand.NewPCG(19, 9))
	gen := func(words []string, sep func() string) string {
		var b strings.Builder
		for b.Len() < countTextBytes {
			b.WriteString(words[r.IntN(len(words))])
			b.WriteString(sep())
		}
		return b.String()[:countTextBytes]
	}
	prose := strings.Fields(`the of and to in is was that for it with as on be at by this had not are but from or
have an they which one you were her all she there would their we him been has when who will more no if out so
said what up its about into than them can only other new some could time these two may then do first any my now
such like our over man me even most made after also did many before must through back years where much your way
well down should because each just those people how too little state good very make world still own see men work
long get here between both life being under never day same another know while last might us great old year off
gateway engine prompt token cache tenant request capacity refuses admission latency throughput memory scheduler`)
	code := strings.Fields(`func return if err != nil { } for range var := ctx context.Context string int []byte
make( ) ( go defer mu.Lock() mu.Unlock() fmt.Errorf("%w", n++ len(s) package import type struct interface select
case <-ch switch default: true false 0x7f`)
	han := []rune("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理世车")
	sentence := func() string {
		if r.IntN(12) == 0 {
			return ". "
		}
		return " "
	}
	indent := func() string {
		switch r.IntN(8) {
		case 0:
			return "\n\t"
		case 1:
			return "\n\t\t"
		}
		return " "
	}
	var cjk strings.Builder
	for cjk.Len() < countTextBytes {
		for range 10 + r.IntN(30) {
			cjk.WriteRune(han[r.IntN(len(han))])
		}
		cjk.WriteString("，。"[3*r.IntN(2) : 3*r.IntN(2)+3])
	}
	return map[string]string{
		"prose":   gen(prose, sentence),
		"code":    gen(code, indent),
		"chinese": cjk.String()[:strings.LastIndexAny(cjk.String()[:countTextBytes], "，。")],
		"onechar": strings.Repeat("a", countTextBytes),
		"spaces":  strings.Repeat(" ", countTextBytes),
	}
}

// mbPerSecond counts text with count until at least min has passed (at least once).
func mbPerSecond(text string, min time.Duration, count func(string) int) (float64, int) {
	n, iters := 0, 0
	start := time.Now()
	for iters == 0 || time.Since(start) < min {
		n = count(text)
		iters++
	}
	return float64(len(text)) * float64(iters) / time.Since(start).Seconds() / 1e6, n
}

// measureCount runs the count phase: rounds rounds, each text by kvgate then tiktoken-go.
func measureCount(rounds int, min time.Duration, log func(string, ...any)) (map[string]*countResult, error) {
	ours, err := tokenize.NewEncoder(tokenize.LibraryKvgate, tokenize.EncodingCl100k)
	if err != nil {
		return nil, err
	}
	codec, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		return nil, err
	}
	kv := func(s string) int { n, _ := ours.Count(s, -1); return n }
	tg := func(s string) int { n, _ := codec.Count(s); return n }
	texts := countTexts()
	out := map[string]*countResult{}
	for _, name := range countTextOrder {
		text := texts[name]
		var a, b []float64
		res := &countResult{Bytes: len(text)}
		for range rounds {
			x, n := mbPerSecond(text, min, kv)
			y, m := mbPerSecond(text, min, tg)
			if n != m {
				log("count %s: kvgate %d tokens, tiktoken-go %d", name, n, m)
			}
			a, b, res.Tokens = append(a, x), append(b, y), n
		}
		res.KvgateMBs, res.TiktokenGoMBs = round1(median(a)), round1(median(b))
		res.Ratio = round1(median(a) / median(b))
		out[name] = res
		log("count %-8s kvgate %7.1f MB/s  tiktoken-go %6.2f MB/s  ×%.1f", name, res.KvgateMBs, res.TiktokenGoMBs, res.Ratio)
	}
	return out, nil
}

func printCount(w io.Writer, c map[string]*countResult) {
	if len(c) == 0 {
		return
	}
	fmt.Fprintf(w, "\n-- counting cl100k_base, MB/s (448 KiB texts; median of rounds)\n")
	fmt.Fprintf(w, "  %-8s %10s %12s %7s %9s\n", "text", "kvgate", "tiktoken-go", "ratio", "tokens")
	for _, name := range countTextOrder {
		if r := c[name]; r != nil {
			fmt.Fprintf(w, "  %-8s %10.1f %12.2f %6.1f× %9d\n", name, r.KvgateMBs, r.TiktokenGoMBs, r.Ratio, r.Tokens)
		}
	}
}
