package reply

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/fingerprint"
	"github.com/kvgate/kvgate/request"
)

// printsText is the gateway's prompt-text detector in miniature: one fingerprint scanner per
// reading, forked from the first.
type printsText struct{ base *fingerprint.Scanner }

type printsRead struct{ sc *fingerprint.Scanner }

func (p *printsText) Reading() TextReading { return printsRead{p.base.Fork()} }
func (p *printsText) Echo(canary.Hit)      {}

func (r printsRead) Feed(s string) *canary.Hit {
	if r.sc.Feed(s) {
		return &canary.Hit{}
	}
	return nil
}

func (r printsRead) Fork() TextReading { return printsRead{r.sc.Clone()} }

// Cost of the prompt-text readings on a streamed reply: 2 KB of content in 8-byte deltas, one
// choice (one reading stands for the joined one) or two interleaved (each choice's reading and
// the joined one), against an index of 200 prompts, beside the same stream without them.
// Allocations are per reply, not per event.
func BenchmarkStreamTextReadings(b *testing.B) {
	ix := fingerprint.NewIndex(fingerprint.NewHasher([]byte("bench secret")), fingerprint.Config{MaxBytes: 1 << 30, CutMatches: 3, CommonTenants: 3})
	words := strings.Fields(strings.Repeat("the quick brown fox jumps over a lazy dog while seven wizards quietly hex ", 40))
	for i := 0; i < 200; i++ {
		fps, _ := ix.Hasher().Prompt(fmt.Sprintf("tenant %d writes: %s", i, strings.Join(words[i%50:i%50+60], " ")))
		ix.Record(fmt.Sprintf("t%d", i), []string{"u0"}, fps, time.Unix(0, 0))
	}
	reply := "Nothing here was in any prompt: " + strings.Repeat("zebra yak xylophone wombat vulture ", 60)
	reply = reply[:2048]
	for _, run := range []struct {
		choices int
		text    bool
	}{{1, false}, {1, true}, {2, false}, {2, true}} {
		choices := run.choices
		var raw strings.Builder
		for i := 0; i < len(reply); i += 8 {
			for c := 0; c < choices; c++ {
				fmt.Fprintf(&raw, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":%d,\"delta\":{\"content\":%q}}]}\n\n", c, reply[i:min(i+8, len(reply))])
			}
		}
		events := []byte(raw.String())
		b.Run(fmt.Sprintf("choices=%d/text=%v", choices, run.text), func(b *testing.B) {
			sc, _ := testScope(&testing.T{}, request.Chat)
			b.SetBytes(int64(len(reply) * choices))
			b.ReportAllocs()
			for b.Loop() {
				sc.Watch = nil
				if run.text {
					sc.Watch = &printsText{base: ix.NewScanner("z", []string{"u0"}, nil)}
				}
				s := NewStream(StreamOptions{Guard: NewGuard(sc), MaxEventBytes: 1 << 20, Sink: funcSink{leak: func() { b.Fatal("leak") }},
					FailEvent: []byte("data: fail\n\n"), CutEvent: []byte("data: cut\n\n")})
				s.Write(events)
				s.End()
				s.Release()
			}
		})
	}
}
