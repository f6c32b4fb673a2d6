package tokenize

import (
	"math/rand/v2"
	"strings"
)

// Deterministic generated corpora: no files, no downloads. Each generator takes a seed and a
// target size in bytes and returns at least that many bytes of valid UTF-8.

var englishWords = strings.Fields(`the of and to in is was that for it with as on be at by this had
not are but from or have an they which one you were her all she there would their we him been has
when who will more no if out so said what up its about into than them can only other new some could
time these two may then do first any my now such like our over man me even most made after also did
many before must through back years where much your way well down should because each just those
people how too little state good very make world still own see men work long get here between both
life being under never day same another know while last might us great old year off come since
against go came right used take three gateway engine prompt token cache tenant request capacity
refuses admission latency throughput pool memory kernel scheduler prefill decode don't it's we'll`)

var goWords = []string{"func", "return", "if", "err", "!=", "nil", "{", "}", "for", "range", "var",
	":=", "ctx", "context.Context", "string", "int", "[]byte", "make(", ")", "(", "go", "defer",
	"mu.Lock()", "mu.Unlock()", "fmt.Errorf(\"%w\",", "n++", "len(s)", "package", "import", "type",
	"struct", "interface", "select", "case", "<-ch", "switch", "default:", "true", "false", "0x7f"}

func englishText(seed uint64, size int) string {
	r := rand.New(rand.NewPCG(seed, 1))
	var b strings.Builder
	for b.Len() < size {
		n := 5 + r.IntN(20)
		for i := range n {
			w := englishWords[r.IntN(len(englishWords))]
			if i == 0 {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			b.WriteString(w)
			switch {
			case i == n-1:
				b.WriteString([]string{". ", "? ", "! ", ".\n", ".\n\n"}[r.IntN(5)])
			case r.IntN(12) == 0:
				b.WriteString(", ")
			case r.IntN(40) == 0:
				b.WriteString(" ")
				b.WriteString(string(rune('0' + r.IntN(10))))
				b.WriteString("42 ")
			default:
				b.WriteByte(' ')
			}
		}
	}
	return b.String()
}

func goCodeText(seed uint64, size int) string {
	r := rand.New(rand.NewPCG(seed, 2))
	var b strings.Builder
	for b.Len() < size {
		depth := r.IntN(4)
		b.WriteString(strings.Repeat("\t", depth))
		n := 2 + r.IntN(8)
		for i := range n {
			b.WriteString(goWords[r.IntN(len(goWords))])
			if i < n-1 && r.IntN(4) != 0 {
				b.WriteByte(' ')
			}
		}
		if r.IntN(6) == 0 {
			b.WriteString(" // ")
			b.WriteString(englishWords[r.IntN(len(englishWords))])
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// commonHanzi are frequent characters, so the text tokenizes like real Chinese (rare ideographs
// cost two or three tokens each).
var commonHanzi = []rune("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音")

// chineseText is CJK ideographs in sentences with full-width punctuation and no spaces, the
// boundary-poorest ordinary text.
func chineseText(seed uint64, size int) string {
	r := rand.New(rand.NewPCG(seed, 3))
	var b strings.Builder
	for b.Len() < size {
		n := 6 + r.IntN(30)
		for range n {
			b.WriteRune(commonHanzi[r.IntN(len(commonHanzi))])
		}
		b.WriteString([]string{"，", "。", "；", "：", "？", "！\n"}[r.IntN(6)])
	}
	return b.String()
}

// mixedText interleaves the three kinds in paragraphs, as chat prompts with pasted code do.
func mixedText(seed uint64, size int) string {
	r := rand.New(rand.NewPCG(seed, 4))
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		part := 200 + r.IntN(4000)
		switch r.IntN(3) {
		case 0:
			b.WriteString(englishText(seed+uint64(i), part))
		case 1:
			b.WriteString("```go\n" + goCodeText(seed+uint64(i), part) + "```\n")
		default:
			b.WriteString(chineseText(seed+uint64(i), part))
		}
		b.WriteString("\n\n")
	}
	return b.String()
}
