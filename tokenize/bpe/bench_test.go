package bpe

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// chineseText is the shape of make bench's Chinese text: runs of 10 to 40 common Han characters
// (one pre-token each) between full-width punctuation.
func chineseText(size int) string {
	r := rand.New(rand.NewPCG(19, 9))
	han := []rune("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理世车")
	var b strings.Builder
	for b.Len() < size {
		for range 10 + r.IntN(30) {
			b.WriteRune(han[r.IntN(len(han))])
		}
		b.WriteString([]string{"，", "。"}[r.IntN(2)])
	}
	return b.String()
}

// BenchmarkVocabCountChinese counts the Chinese text's pre-tokens with cl100k_base's vocabulary.
func BenchmarkVocabCountChinese(b *testing.B) {
	v := testVocabs(b)["cl100k_base"].v
	split, err := NewSplitter(PatternCl100k)
	if err != nil {
		b.Fatal(err)
	}
	text := chineseText(448 << 10)
	var sc Scratch
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		n := 0
		for i := 0; i < len(text); {
			j := split.Next(text, i)
			n += v.cachedCount(text, i, j, &sc)
			i = j
		}
	}
}

// proseText is the shape of make bench's prose: common words, a full stop now and then.
func proseText(size int) string {
	r := rand.New(rand.NewPCG(19, 9))
	words := strings.Fields(`the of and to in is was that for it with as on be at by this had not are but from or
have an they which one you were her all she there would their we him been has when who will more no if out so
said what up its about into than them can only other new some could time these two may then do first any my now
gateway engine prompt token cache tenant request capacity refuses admission latency throughput memory scheduler`)
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(words[r.IntN(len(words))])
		if r.IntN(12) == 0 {
			b.WriteString(". ")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// BenchmarkCounterProse counts prose with cl100k_base through Counter.Count (split, piece cache,
// vocabulary).
func BenchmarkCounterProse(b *testing.B) {
	split, err := NewSplitter(PatternCl100k)
	if err != nil {
		b.Fatal(err)
	}
	c := NewCounter("cl100k_base", split, testVocabs(b)["cl100k_base"].v, nil, nil)
	text := proseText(448 << 10)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		c.Count(text, -1)
	}
}

// codeText is the shape of make bench's code: Go tokens, indented lines.
func codeText(size int) string {
	r := rand.New(rand.NewPCG(19, 9))
	words := strings.Fields(`func return if err != nil { } for range var := ctx context.Context string int []byte
make( ) ( go defer mu.Lock() mu.Unlock() fmt.Errorf("%w", n++ len(s) package import type struct interface select
case <-ch switch default: true false 0x7f`)
	var b strings.Builder
	for b.Len() < size {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteString([]string{"\n\t", "\n\t\t", " ", " ", " ", " ", " ", " "}[r.IntN(8)])
	}
	return b.String()
}

// BenchmarkCounterCode counts code with cl100k_base through Counter.Count.
func BenchmarkCounterCode(b *testing.B) {
	split, err := NewSplitter(PatternCl100k)
	if err != nil {
		b.Fatal(err)
	}
	c := NewCounter("cl100k_base", split, testVocabs(b)["cl100k_base"].v, nil, nil)
	text := codeText(448 << 10)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		c.Count(text, -1)
	}
}
