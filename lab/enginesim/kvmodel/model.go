package kvmodel

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// minRun is the shortest quote the model makes when room allows: long
// enough that a quoted canary marker is recognisable, short enough that a
// reply samples many places of its context.
const minRun = 16

// SeqView is one request's view of the pool through its page table. It is
// not safe for concurrent use; callers lock the pool.
type SeqView struct {
	Pool  *Pool
	Pages []int32
	Self  *Writer // the request reading and writing through this view
}

// Slot is the pool slot at sequence position pos.
func (v *SeqView) Slot(pos int) *Slot { return &v.Pool.Slots[v.Pool.SlotIndex(v.Pages, pos)] }

// Write stores token id and its text at sequence position pos as Self's.
func (v *SeqView) Write(pos int, id uint32, text string) {
	s := v.Slot(pos)
	s.W, s.ID, s.Text, s.Pos = v.Self, id, text, int32(pos)
}

func isSpaceByte(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }

// GenOut is what the model produced over one sequence.
type GenOut struct {
	IDs     []uint32
	Texts   []string
	Foreign []*Writer // writers other than the request found in its context
	Quoted  []*Writer // foreign writers whose slots were quoted
	Unowned bool      // the context holds a slot the request did not write
	// Sources are where the generated tokens came from, in order: stretches of one writer's
	// consecutive positions. A quote runs across page boundaries, so one run can join
	// stretches of several requests (the simulator's log shows them: see Provenance).
	Sources []Source
}

// Source is a stretch of N generated tokens, IDs[At:At+N], copied from writer W's positions
// [From, From+N).
type Source struct {
	W           *Writer
	At, From, N int
}

// addSource notes that the next generated token came from slot s.
func (g *GenOut) addSource(s *Slot) {
	at := len(g.IDs)
	if n := len(g.Sources); n > 0 {
		last := &g.Sources[n-1]
		if last.W == s.W && last.From+last.N == int(s.Pos) && last.At+last.N == at {
			last.N++
			return
		}
	}
	g.Sources = append(g.Sources, Source{W: s.W, At: at, From: int(s.Pos), N: 1})
}

// Provenance lists the stretches quoted from writers other than self as "rid@from+n", in
// reply order: which requests' prompts (and where in them) a leaking reply reads.
func (g *GenOut) Provenance(self *Writer) string {
	var b strings.Builder
	for _, s := range g.Sources {
		if s.W == self || s.W == nil {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s@%d+%d", s.W.RID, s.From, s.N)
	}
	return b.String()
}

// ContextReport lists the foreign writers of positions [0, n) in first-seen
// order and whether any slot there is not the request's own.
func (v *SeqView) ContextReport(n int) (foreign []*Writer, unowned bool) {
	var last *Writer
	for pos := 0; pos < n; pos++ {
		w := v.Slot(pos).W
		if w == v.Self {
			continue
		}
		unowned = true
		if w == nil || w == last {
			continue
		}
		last = w
		seen := false
		for _, f := range foreign {
			if f == w {
				seen = true
				break
			}
		}
		if !seen {
			foreign = append(foreign, w)
		}
	}
	return foreign, unowned
}

// Generate produces exactly maxNew tokens (fewer only when nothing in the
// context can be read) by quoting runs of at least minRun tokens that start
// and end at word boundaries, spread over the context [0, promptLen) plus
// what has been generated so far. Each generated token is written to the
// pool at the next position. pad is the token used to fill a reply when no
// whole word fits the room left (a space, so boundaries stay clean).
func (v *SeqView) Generate(promptLen, maxNew int, rng *rand.Rand, padID uint32, padText string) GenOut {
	var g GenOut
	g.Foreign, g.Unowned = v.ContextReport(promptLen)
	g.IDs = make([]uint32, 0, maxNew)
	g.Texts = make([]string, 0, maxNew)
	readable := func(pos int) bool { return v.Slot(pos).W != nil }
	// start: a run may begin at pos when a word begins there.
	start := func(pos int) bool {
		if !readable(pos) {
			return false
		}
		if pos == 0 || !readable(pos-1) {
			return true
		}
		prev, cur := v.Slot(pos-1).Text, v.Slot(pos).Text
		return prev == "" || cur == "" || isSpaceByte(prev[len(prev)-1]) || isSpaceByte(cur[0])
	}
	// end: a run may stop before pos (limit is the run's readable end).
	end := func(pos, limit int) bool {
		if pos >= limit || !readable(pos) {
			return true
		}
		prev, cur := v.Slot(pos-1).Text, v.Slot(pos).Text
		return prev == "" || cur == "" || isSpaceByte(prev[len(prev)-1]) || isSpaceByte(cur[0])
	}
	k := (maxNew + minRun - 1) / minRun
	if k < 1 {
		k = 1
	}
	anyReadable := false
	quotedSeen := map[*Writer]bool{}
	for attempt := 0; len(g.IDs) < maxNew && attempt < 4*k+8; attempt++ {
		limit := promptLen + len(g.IDs)
		if limit == 0 {
			break
		}
		// Stratified anchors: the first k attempts cover the context evenly.
		r := attempt % k
		anchor := int((float64(r) + rng.Float64()) * float64(limit) / float64(k))
		a := -1
		for pos := anchor; pos < limit; pos++ {
			if start(pos) {
				a = pos
				break
			}
		}
		if a < 0 {
			continue
		}
		anyReadable = true
		// Runs are glued with a space when neither side has one, so a quoted
		// word never fuses with the next run into a longer word.
		sep := 0
		if n := len(g.Texts); n > 0 {
			prev, cur := g.Texts[n-1], v.Slot(a).Text
			if prev != "" && cur != "" && !isSpaceByte(prev[len(prev)-1]) && !isSpaceByte(cur[0]) {
				sep = 1
			}
		}
		room := maxNew - len(g.IDs) - sep
		if room <= 0 {
			break
		}
		lastEnd := -1
		for b := a + 1; b <= limit && b-a <= room; b++ {
			if !readable(b - 1) {
				break
			}
			if end(b, limit) {
				lastEnd = b
				if b-a >= minRun {
					break
				}
			}
		}
		if lastEnd <= a {
			continue
		}
		if sep == 1 {
			v.Write(promptLen+len(g.IDs), padID, padText)
			g.IDs = append(g.IDs, padID)
			g.Texts = append(g.Texts, padText)
		}
		for pos := a; pos < lastEnd; pos++ {
			s := v.Slot(pos)
			if s.W != v.Self && !quotedSeen[s.W] {
				quotedSeen[s.W] = true
				g.Quoted = append(g.Quoted, s.W)
			}
			id, text := s.ID, s.Text
			g.addSource(s)
			v.Write(promptLen+len(g.IDs), id, text)
			g.IDs = append(g.IDs, id)
			g.Texts = append(g.Texts, text)
		}
	}
	if !anyReadable {
		for pos := 0; pos < promptLen; pos++ {
			if readable(pos) {
				anyReadable = true
				break
			}
		}
	}
	if anyReadable {
		for len(g.IDs) < maxNew {
			v.Write(promptLen+len(g.IDs), padID, padText)
			g.IDs = append(g.IDs, padID)
			g.Texts = append(g.Texts, padText)
		}
	}
	return g
}

// JoinRIDs lists the writers' request ids, comma-separated.
func JoinRIDs(ws []*Writer) string {
	if len(ws) == 0 {
		return ""
	}
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(w.RID)
	}
	return b.String()
}
