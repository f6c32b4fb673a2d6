// Package sse parses an event stream as the HTML living standard defines it (the
// text/event-stream format), so that the gateway reads an engine's stream exactly as a client
// would: LF, CRLF and lone CR line ends, comment lines, "field: value" and bare "field" lines,
// several data lines joined with "\n", a leading BOM dropped. It knows nothing about JSON.
package sse

import (
	"bytes"
	"errors"
)

// Event is one dispatched event. Data is the joined data lines; an event with no data line is
// never dispatched (as in the standard). Data is the parser's buffer: valid until the parser's
// next Write, Next or End (copy what must outlive that).
type Event struct {
	Name string // the "event" field; empty means "message"
	ID   string
	Data []byte
}

// ErrTooLarge is returned when one event (or one line) grows past the parser's limit.
var ErrTooLarge = errors.New("sse: event larger than the limit")

// Parser splits bytes into events incrementally: Write what arrives, then take events with Next.
// Each byte is examined once (no rescans), and an event larger than the limit is an error instead
// of an ever-growing buffer.
type Parser struct {
	max     int
	buf     []byte // bytes not yet split into lines
	store   []byte // buf's array from its start: reused once buf is consumed (no allocation per Write)
	name    string // the last event name, reused while names repeat (no allocation per event)
	scanned int    // bytes of buf already searched for a line end
	started bool   // past the optional BOM
	lastCR  bool   // the previous line ended with CR: a following LF belongs to it
	size    int    // bytes of the event being built
	ev      Event
	hasData bool
	data    []byte
}

// NewParser returns a parser whose events (and lines) may not exceed max bytes.
func NewParser(max int) *Parser { return &Parser{max: max} }

// Write appends stream bytes. What is left of earlier Writes moves to the front of the parser's
// buffer first, so a stream reuses one buffer.
func (p *Parser) Write(b []byte) {
	if len(p.buf) == 0 || len(p.buf)+len(b) <= cap(p.store) && len(p.buf) <= cap(p.store)/2 {
		p.buf = append(p.store[:0], p.buf...) // (copy moves overlapping bytes correctly)
	}
	old := cap(p.buf)
	p.buf = append(p.buf, b...)
	if cap(p.buf) != old {
		p.store = p.buf[:0] // a new array: buf starts at its base
	}
}

// Buffered is how many bytes wait for a line end.
func (p *Parser) Buffered() int { return len(p.buf) }

// Next returns the next complete event, ok=false when more bytes are needed. At end of stream,
// call End: the standard drops an event that was not terminated by a blank line.
func (p *Parser) Next() (ev Event, ok bool, err error) {
	for {
		if !p.started {
			if len(p.buf) < 3 && bytes.HasPrefix([]byte("\xEF\xBB\xBF"), p.buf) {
				return Event{}, false, nil // could still be a BOM
			}
			p.buf = bytes.TrimPrefix(p.buf, []byte("\xEF\xBB\xBF"))
			p.started = true
		}
		if p.lastCR && len(p.buf) > 0 {
			if p.buf[0] == '\n' {
				p.buf = p.buf[1:]
			}
			p.lastCR = false
		}
		i := lineEnd(p.buf[p.scanned:])
		if i < 0 {
			p.scanned = len(p.buf)
			if p.size+len(p.buf) > p.max {
				return Event{}, false, ErrTooLarge
			}
			p.compact()
			return Event{}, false, nil
		}
		end := p.scanned + i
		line := p.buf[:end]
		next := end + 1
		if p.buf[end] == '\r' {
			if next == len(p.buf) {
				p.lastCR = true // an LF may follow in the next Write
			} else if p.buf[next] == '\n' {
				next++
			}
		}
		p.size += next
		if p.size > p.max {
			return Event{}, false, ErrTooLarge
		}
		dispatch := p.line(line)
		p.buf = p.buf[next:]
		p.scanned = 0
		if dispatch {
			ev := p.ev
			ev.Data = p.data
			p.ev, p.data, p.hasData, p.size = Event{}, p.data[:0], false, 0
			return ev, true, nil
		}
	}
}

// lineEnd is bytes.IndexAny(b, "\r\n") by two byte searches (each vectorised), CR being rare.
func lineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.IndexByte(b, '\r')
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

// compact keeps buf from growing by the bytes already consumed.
func (p *Parser) compact() {
	if cap(p.buf) > 4096 && len(p.buf) < cap(p.buf)/4 {
		p.buf = append(p.store[:0], p.buf...)
	}
}

// line processes one line; true means a blank line dispatched an event with data.
func (p *Parser) line(line []byte) bool {
	if len(line) == 0 {
		if !p.hasData {
			p.ev, p.size = Event{}, 0
			return false
		}
		return true
	}
	if line[0] == ':' {
		return false // comment
	}
	field, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		field, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if p.hasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.hasData = true
	case "event":
		if string(value) != p.name {
			p.name = string(value)
		}
		p.ev.Name = p.name
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			p.ev.ID = string(value)
		}
	}
	// "retry" and unknown fields change nothing a reader of the data sees.
	return false
}

// End is called once the stream has ended: an event still being built (its blank line never
// came) is returned when it has data, so that the caller can treat it like any other event
// instead of passing or dropping bytes unexamined.
func (p *Parser) End() (Event, bool) {
	if len(p.buf) > 0 {
		p.line(p.buf)
		p.buf = nil
	}
	if !p.hasData {
		return Event{}, false
	}
	ev := p.ev
	ev.Data = p.data
	p.ev, p.data, p.hasData, p.size = Event{}, nil, false, 0
	return ev, true
}
