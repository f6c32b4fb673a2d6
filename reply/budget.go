package reply

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"time"

	"github.com/kvgate/kvgate/config"
)

// Budget is upstream.max_buffered_bytes: the memory that all non-streaming replies in flight
// together may hold. A whole reply is buffered to be scanned before the client gets any of it,
// so without a bound a few large replies take the process's memory (four 60 MB replies took the
// gateway past 1 GB of RSS, never given back).
//
// A reply is charged, step by step and before each step allocates, what the step allocates: the
// body read, the decoded value, the re-serialised output. Nothing is given back while the reply
// is in flight, because Go frees nothing until a garbage collection finds it dead. A large
// reply's bytes are given back only after a collection that ran once the reply was done
// (debug.FreeOSMemory, which also returns the pages to the OS): so the budget bounds what the
// process's RSS grows by, not only what is live.

// replyBudgetWait is how long a reply waits for bytes another reply is giving back before it is
// refused (collections after big replies take milliseconds to a second).
const replyBudgetWait = 2 * time.Second

// reclaimAfter: replies charged at least this much are given back after a collection; smaller
// ones at once (a collection per small reply would cost more than their bytes).
const reclaimAfter = 4 << 20

type Budget struct {
	max int64

	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed (and replaced) whenever bytes come back

	// active are the tickets of replies in flight: the oldest may wait for bytes while it holds
	// some (see reserve).
	active map[uint64]struct{}
	ticket uint64

	pending int64         // given back by finished replies, charged until a collection has run
	kick    chan struct{} // wakes the reclaimer (buffered, one)
	start   sync.Once
}

func NewBudget(max int64) *Budget {
	return &Budget{max: max, freed: make(chan struct{}), kick: make(chan struct{}, 1), active: map[uint64]struct{}{}}
}

// take charges n bytes, waiting up to wait for others to give bytes back. False: over budget.
func (b *Budget) take(n int64, wait time.Duration) bool {
	if n > b.max {
		return false
	}
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return true
		}
		ch := b.freed
		b.mu.Unlock()
		if timer == nil {
			if wait <= 0 {
				return false
			}
			timer = time.NewTimer(wait)
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

func (b *Budget) give(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// release gives back what a finished reply was charged: small amounts at once, large ones after
// the next collection.
func (b *Budget) release(n int64) {
	if n < reclaimAfter {
		b.give(n)
		return
	}
	b.mu.Lock()
	b.pending += n
	b.mu.Unlock()
	b.start.Do(func() { go b.reclaim() })
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// reclaim runs one collection per batch of finished large replies and then gives their bytes
// back. It lives as long as the process (one goroutine, idle on a channel).
func (b *Budget) reclaim() {
	for range b.kick {
		b.mu.Lock()
		n := b.pending
		b.pending = 0
		b.mu.Unlock()
		if n == 0 {
			continue
		}
		func() {
			// Whatever happens to the collection, the bytes come back: a lost charge would shrink
			// the budget for good.
			defer b.give(n)
			debug.FreeOSMemory()
		}()
	}
}

// InUse is what is charged now (pending reclaim included).
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// oldest says whether ticket is the oldest reply in flight.
func (b *Budget) oldest(ticket uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for t := range b.active {
		if t < ticket {
			return false
		}
	}
	return true
}

// Charge is one reply's account with the budget: held is taken from the budget, spent is
// what the reply's steps have allocated so far (never more than held).
type Charge struct {
	b           *Budget
	ticket      uint64
	held, spent int64
	once        sync.Once
}

// Reserve takes n bytes ahead of the steps that will spend them (ReplyCostFactor times what is
// read). A reply that holds nothing yet waits for bytes to come back, and so does the oldest
// reply in flight; any other reply that holds bytes and cannot grow is refused at once. Replies
// that waited while holding could block each other until all of them failed; this way the
// younger ones give way and the oldest is served.
func (c *Charge) Reserve(n int64) bool {
	if n <= 0 {
		return true
	}
	wait := replyBudgetWait
	if c.held > 0 && !c.b.oldest(c.ticket) {
		wait = 0
	}
	if !c.b.take(n, wait) {
		return false
	}
	c.held += n
	return true
}

// Spend accounts n bytes a step is about to allocate, taking more from the budget when the
// reservation is used up; false means the budget is spent (the reply must be refused).
func (c *Charge) Spend(n int64) bool {
	if n <= 0 {
		return true
	}
	if over := c.spent + n - c.held; over > 0 && !c.Reserve(max(over, 1<<20)) {
		return false
	}
	c.spent += n
	return true
}

// Done gives everything back (once).
func (c *Charge) Done() {
	c.once.Do(func() {
		c.b.mu.Lock()
		delete(c.b.active, c.ticket)
		c.b.mu.Unlock()
		c.b.release(c.held)
	})
}

// Max is the budget in bytes.
func (b *Budget) Max() int64 { return b.max }

// NewCharge opens one reply's account.
func (b *Budget) NewCharge() *Charge {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ticket++
	b.active[b.ticket] = struct{}{}
	return &Charge{b: b, ticket: b.ticket}
}

var ErrTooLarge = errors.New("reply larger than upstream.max_reply_bytes")

// readPiece is how a reply of undeclared length is read: pieces of this size, joined once.
const readPiece = 1 << 20

// ReadWhole reads a whole reply body of at most maxBytes, reserving ReplyCostFactor times what it
// reads before reading it (the decoded value and the output that follow cost about as much as
// the body each). A declared length is read into one buffer of that size; otherwise the body is
// read in pieces and joined once, so it costs one more copy, and no series of doubling buffers.
func ReadWhole(src io.Reader, declared, maxBytes int, c *Charge) ([]byte, error) {
	if declared > maxBytes {
		return nil, fmt.Errorf("%w (%d, declared)", ErrTooLarge, maxBytes)
	}
	if declared >= 0 {
		if !c.Reserve(config.ReplyCostFactor * int64(declared)) {
			return nil, ErrBudget
		}
		c.spent += int64(declared)
		body := make([]byte, declared)
		if _, err := io.ReadFull(src, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	var pieces [][]byte
	total := 0
	for {
		size := readPiece
		if len(pieces) == 0 {
			size = 64 << 10 // most replies are small
		}
		if !c.Reserve(config.ReplyCostFactor*int64(size)) || !c.Spend(int64(size)) {
			return nil, ErrBudget
		}
		p := make([]byte, size)
		n := 0
		var err error
		for n < size && err == nil {
			var m int
			m, err = src.Read(p[n:])
			n += m
		}
		total += n
		if total > maxBytes {
			return nil, fmt.Errorf("%w (%d)", ErrTooLarge, maxBytes)
		}
		pieces = append(pieces, p[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err // a truncated body is an error, not a short reply
		}
	}
	if len(pieces) == 1 {
		return pieces[0], nil
	}
	if !c.Spend(int64(total)) {
		return nil, ErrBudget
	}
	body := make([]byte, 0, total)
	for _, p := range pieces {
		body = append(body, p...)
	}
	return body, nil
}

// ChargedBody is a reply's output as the client's body: its charge is given back when the server
// has written it (or dropped it), not when the handler returns, so a slow reader's buffered
// reply stays counted.
func ChargedBody(out []byte, c *Charge) io.ReadCloser {
	return &chargedBody{Reader: bytes.NewReader(out), c: c}
}

type chargedBody struct {
	*bytes.Reader
	c *Charge
}

func (b *chargedBody) Close() error {
	b.c.Done()
	return nil
}
