package enginesim

import (
	"strings"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// The two vLLM advisories of 2026-11-09, replayed on the engine's batch: a generating request
// holds a batch slot (a row of the engine's persistent batch) from its generation until its
// reply is done, the lowest free one first.
//
//   - batch-slot-residue (GHSA-v97p-wpxp-px84): asynchronous scheduling with pipeline
//     parallelism feeds a new request the tokens its slot's previous occupant sampled last, so
//     its reply begins with Config.ResidueTokens of them (that request's text: the model quotes
//     its own prompt).
//   - forced-reasoning-end (GHSA-fpch-3xrf-7q96): a request that exhausts its
//     thinking_token_budget has the reasoning-end string forced into another running request's
//     output instead of its own. Honest, the string ends its own output's reasoning at the
//     budget.
//
// Each leak is recorded (Leaks) as the ground truth the lab checks the gateway against.

// slotState is one batch slot: its occupant, and what the last one left.
type slotState struct {
	busy    *outcome
	residue []tok
	from    *kvmodel.Writer
	prompt  string // the previous occupant's prompt text, for the ground truth
}

type tok struct {
	id   uint32
	text string
}

// Leak is one cross-request leak the simulator caused on purpose (ground truth for the lab).
type Leak struct {
	Bug       string
	Requester string // the reply's request id and prompt text
	Prompt    string
	Victim    string // the request whose state leaked, and its prompt text
	VictimRID string
	Text      string // what went into the requester's reply
}

// maxLeaks bounds the ground-truth record.
const maxLeaks = 4096

// takeSlot gives o a batch slot and applies the advisories' bugs to its output. s.mu held.
func (s *Server) takeSlot(o *outcome, self *kvmodel.Writer, prompt []string, budget int) {
	i := 0
	for i < len(s.slots) && s.slots[i].busy != nil {
		i++
	}
	if i == len(s.slots) {
		s.slots = append(s.slots, slotState{})
	}
	sl := &s.slots[i]
	sl.busy, o.slot = o, i
	o.prompt, o.budget = strings.Join(prompt, ""), budget
	if s.cfg.Bug == kvmodel.BugBatchSlotResidue && len(sl.residue) > 0 && len(o.gen.IDs) > 0 {
		n := min(len(sl.residue), len(o.gen.IDs))
		var text strings.Builder
		for k, t := range sl.residue[:n] {
			o.gen.IDs[k], o.gen.Texts[k] = t.id, t.text
			text.WriteString(t.text)
		}
		o.gen.Foreign = appendWriter(o.gen.Foreign, sl.from)
		o.gen.Quoted = appendWriter(o.gen.Quoted, sl.from)
		s.noteLeak(Leak{Bug: s.cfg.Bug, Requester: self.RID, Prompt: o.prompt, Victim: sl.prompt, VictimRID: sl.from.RID, Text: text.String()})
	}
	s.reasoningEnd(o, self)
}

// reasoningEnd places the reasoning-end string of budgets that run out while o generates:
// o's own (honest: at its budget), or, with the bug, another running request's, which goes
// into o's output instead of that request's. s.mu held.
func (s *Server) reasoningEnd(o *outcome, self *kvmodel.Writer) {
	if s.cfg.ReasoningEnd == "" {
		return
	}
	if s.cfg.Bug != kvmodel.BugForcedReasoningEnd {
		if o.budget > 0 && o.budget < len(o.gen.IDs) {
			s.insertEnd(o, o.budget)
		}
		return
	}
	for k := range s.slots {
		h := s.slots[k].busy
		if h == nil || h == o || h.budget <= 0 || h.budget >= len(h.gen.IDs) || h.forcedOut {
			continue
		}
		// h's budget runs out while o runs: the forced string lands in o, at o's next token.
		h.forcedOut = true
		at := min(len(o.gen.IDs), 1)
		s.insertEnd(o, at)
		s.noteLeak(Leak{Bug: s.cfg.Bug, Requester: self.RID, Prompt: o.prompt, Victim: h.prompt, VictimRID: h.self.RID, Text: s.cfg.ReasoningEnd})
		return
	}
}

// insertEnd puts the reasoning-end string's tokens into o's output at token at, keeping its
// length.
func (s *Server) insertEnd(o *outcome, at int) {
	ids, texts := s.tok.Encode(s.cfg.ReasoningEnd)
	n := len(o.gen.IDs)
	o.gen.IDs = append(append(append([]uint32(nil), o.gen.IDs[:at]...), ids...), o.gen.IDs[at:]...)[:n]
	o.gen.Texts = append(append(append([]string(nil), o.gen.Texts[:at]...), texts...), o.gen.Texts[at:]...)[:n]
}

// leaveSlot frees o's slot, leaving its last sampled tokens there. s.mu held.
func (s *Server) leaveSlot(o *outcome) {
	if o.slot < 0 || o.slot >= len(s.slots) || s.slots[o.slot].busy != o {
		return
	}
	sl := &s.slots[o.slot]
	sl.busy = nil
	o.slot = -1
	if len(o.gen.IDs) == 0 {
		return
	}
	r := max(s.cfg.ResidueTokens, 0)
	from := max(len(o.gen.IDs)-r, 0)
	sl.residue = sl.residue[:0]
	for k := from; k < len(o.gen.IDs); k++ {
		sl.residue = append(sl.residue, tok{o.gen.IDs[k], o.gen.Texts[k]})
	}
	sl.from, sl.prompt = o.self, o.prompt
}

func (s *Server) noteLeak(l Leak) {
	s.statsMu.Lock()
	if len(s.leaks) < maxLeaks {
		s.leaks = append(s.leaks, l)
	}
	s.statsMu.Unlock()
	s.logf("LEAK %s rid=%s got %q of request %s", l.Bug, l.Requester, l.Text, l.VictimRID)
}

// Leaks returns the leaks the advisories' bugs caused so far (at most 4,096), oldest first.
func (s *Server) Leaks() []Leak {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return append([]Leak(nil), s.leaks...)
}

func appendWriter(ws []*kvmodel.Writer, w *kvmodel.Writer) []*kvmodel.Writer {
	for _, x := range ws {
		if x == w {
			return ws
		}
	}
	return append(ws, w)
}
