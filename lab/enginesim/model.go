package enginesim

import (
	"math/rand/v2"
	"strings"
)

// minRun is the shortest quote the model makes when room allows: long
// enough that a quoted canary marker is recognisable, short enough that a
// reply samples many places of its context.
const minRun = 16

// seqView is one request's view of the pool through its page table.
type seqView struct {
	pool  *Pool
	pages []int32
	self  *Writer
}

func (v *seqView) slot(pos int) *Slot { return &v.pool.Slots[v.pool.SlotIndex(v.pages, pos)] }

func (v *seqView) write(pos int, id uint32, text string) {
	s := v.slot(pos)
	s.W, s.ID, s.Text = v.self, id, text
}

func isSpaceByte(b byte) bool { return b == ' ' || b == '\n' || b == '\t' || b == '\r' }

// genOut is what the model produced over one sequence.
type genOut struct {
	ids     []uint32
	texts   []string
	foreign []*Writer // writers other than the request found in its context
	quoted  []*Writer // foreign writers whose slots were quoted
	unowned bool      // the context holds a slot the request did not write
}

// contextReport lists the foreign writers of positions [0, n) in first-seen
// order and whether any slot there is not the request's own.
func (v *seqView) contextReport(n int) (foreign []*Writer, unowned bool) {
	var last *Writer
	for pos := 0; pos < n; pos++ {
		w := v.slot(pos).W
		if w == v.self {
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

// generate produces exactly maxNew tokens (fewer only when nothing in the
// context can be read) by quoting runs of at least minRun tokens that start
// and end at word boundaries, spread over the context [0, promptLen) plus
// what has been generated so far. Each generated token is written to the
// pool at the next position. pad is the token used to fill a reply when no
// whole word fits the room left (a space, so boundaries stay clean).
func (v *seqView) generate(promptLen, maxNew int, rng *rand.Rand, padID uint32, padText string) genOut {
	var g genOut
	g.foreign, g.unowned = v.contextReport(promptLen)
	g.ids = make([]uint32, 0, maxNew)
	g.texts = make([]string, 0, maxNew)
	readable := func(pos int) bool { return v.slot(pos).W != nil }
	// start: a run may begin at pos when a word begins there.
	start := func(pos int) bool {
		if !readable(pos) {
			return false
		}
		if pos == 0 || !readable(pos-1) {
			return true
		}
		prev, cur := v.slot(pos-1).Text, v.slot(pos).Text
		return prev == "" || cur == "" || isSpaceByte(prev[len(prev)-1]) || isSpaceByte(cur[0])
	}
	// end: a run may stop before pos (limit is the run's readable end).
	end := func(pos, limit int) bool {
		if pos >= limit || !readable(pos) {
			return true
		}
		prev, cur := v.slot(pos-1).Text, v.slot(pos).Text
		return prev == "" || cur == "" || isSpaceByte(prev[len(prev)-1]) || isSpaceByte(cur[0])
	}
	k := (maxNew + minRun - 1) / minRun
	if k < 1 {
		k = 1
	}
	anyReadable := false
	quotedSeen := map[*Writer]bool{}
	for attempt := 0; len(g.ids) < maxNew && attempt < 4*k+8; attempt++ {
		limit := promptLen + len(g.ids)
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
		if n := len(g.texts); n > 0 {
			prev, cur := g.texts[n-1], v.slot(a).Text
			if prev != "" && cur != "" && !isSpaceByte(prev[len(prev)-1]) && !isSpaceByte(cur[0]) {
				sep = 1
			}
		}
		room := maxNew - len(g.ids) - sep
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
			v.write(promptLen+len(g.ids), padID, padText)
			g.ids = append(g.ids, padID)
			g.texts = append(g.texts, padText)
		}
		for pos := a; pos < lastEnd; pos++ {
			s := v.slot(pos)
			if s.W != v.self && !quotedSeen[s.W] {
				quotedSeen[s.W] = true
				g.quoted = append(g.quoted, s.W)
			}
			id, text := s.ID, s.Text
			v.write(promptLen+len(g.ids), id, text)
			g.ids = append(g.ids, id)
			g.texts = append(g.texts, text)
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
		for len(g.ids) < maxNew {
			v.write(promptLen+len(g.ids), padID, padText)
			g.ids = append(g.ids, padID)
			g.texts = append(g.texts, padText)
		}
	}
	return g
}

func joinRIDs(ws []*Writer) string {
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
