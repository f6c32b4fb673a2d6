package fairqueue

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPropertyRefundsBuyNothing runs adversarial schedules (issue 40's reserve-then-refund
// shape) through a fake pool in discrete steps, no clock. Heavy tenants stay backlogged with
// generous bookings (max_tokens up to the pool) and short replies, disconnect while waiting or
// mid-reply, fail without usage, and send bursts of tiny requests; interactive tenants send one
// small request at a time. It checks, from the public API only:
//
//   - a tenant that starts waiting is lifted no higher than the smallest *settled* counter
//     among the waiting tenants (counter minus the charges still held by requests in flight,
//     which the test tracks itself): a refund cannot lower a heavy tenant below a newcomer;
//   - a newcomer that was lifted goes before every tenant that was waiting when it arrived, but
//     for one request each (a tie on the counter): nobody jumps it by refunds meanwhile (unless
//     its own head is large, which the others pass by design);
//   - a tenant's settled counter never falls.
//
// db312c1's lift (to counters that still hold unsettled charges) fails the first two. The
// whole-pool variant adds heads that book up to the whole pool (prompt + max_tokens up to 1.5×
// the pool, Ticket.Pool set): passing them must not let their tenant jump a newcomer either.
func TestPropertyRefundsBuyNothing(t *testing.T) {
	for _, wholePool := range []bool{false, true} {
		for seed := uint64(0); seed < 300; seed++ {
			if err := refundSchedule(seed, wholePool); err != nil {
				t.Fatalf("whole-pool heads %v, seed %d: %v", wholePool, seed, err)
			}
		}
	}
}

type flight struct {
	tk     *Ticket
	charge float64 // what the test holds as unsettled for it: its booking over its weight
}

func refundSchedule(seed uint64, wholePool bool) error {
	r := rand.New(rand.NewPCG(seed, 40))
	q := New(Fair, 0)
	p := &pool{size: int64(2000 + r.IntN(18000))}
	heavy := []string{"h1", "h2", "h3"}[:1+r.IntN(3)]
	light := []string{"l1", "l2"}[:1+r.IntN(2)]
	weight := map[string]float64{}
	for _, n := range append(append([]string{}, heavy...), light...) {
		weight[n] = float64(1 + r.IntN(4))
	}
	var running []flight
	unsettled := map[string]float64{} // per tenant: charges of requests dispatched, not settled
	settledSeen := map[string]float64{}
	waiting := map[string][]*Ticket{}
	// A newcomer under watch: who was waiting when it arrived, and their dispatches since.
	type watch struct {
		tk     *Ticket
		before map[string]int
	}
	var watches []*watch
	var fault error
	fits := func(tk *Ticket) bool {
		if !p.fits(tk) {
			return false
		}
		running = append(running, flight{tk, float64(tk.booking()) / tk.Weight})
		unsettled[tk.Tenant] += float64(tk.booking()) / tk.Weight
		w := waiting[tk.Tenant]
		for i, x := range w {
			if x == tk {
				waiting[tk.Tenant] = append(w[:i:i], w[i+1:]...)
				break
			}
		}
		keep := watches[:0]
		for _, wa := range watches {
			if wa.tk == tk {
				continue // the newcomer went: stop watching it
			}
			if _, ok := wa.before[tk.Tenant]; ok {
				wa.before[tk.Tenant]++
				if wa.before[tk.Tenant] > 1 && fault == nil {
					fault = fmt.Errorf("%s dispatched %d times while newcomer %s (lifted) waited", tk.Tenant, wa.before[tk.Tenant], wa.tk.Tenant)
				}
			}
			keep = append(keep, wa)
		}
		watches = keep
		return true
	}
	settledOf := func(n string) float64 { return q.Counter(n) - unsettled[n] }
	submit := func(tk *Ticket) error {
		floor, anyWaiting := 0.0, false
		for n, w := range waiting {
			if len(w) > 0 && n != tk.Tenant {
				if s := settledOf(n); !anyWaiting || s < floor {
					floor = s
				}
				anyWaiting = true
			}
		}
		newcomer := len(waiting[tk.Tenant]) == 0
		before := q.Counter(tk.Tenant)
		var wa *watch
		// A head booking over half the pool may be large and is then passed by design: watch only
		// newcomers that can never be large.
		if newcomer && anyWaiting && unsettled[tk.Tenant] == 0 && before <= floor && (tk.Pool == 0 || 2*tk.booking() <= tk.Pool) {
			wa = &watch{tk: tk, before: map[string]int{}}
			for n, w := range waiting {
				if len(w) > 0 {
					wa.before[n] = 0
				}
			}
			watches = append(watches, wa)
		}
		waiting[tk.Tenant] = append(waiting[tk.Tenant], tk)
		if err := q.Submit(tk, fits); err != nil {
			return err
		}
		if newcomer && anyWaiting {
			// The counter read after Submit includes tk's own charge when it went at once.
			got := settledOf(tk.Tenant)
			if got > max(before, floor)+1e-6 {
				return fmt.Errorf("newcomer %s lifted to settled %.1f, above max(own %.1f, smallest settled waiting %.1f)", tk.Tenant, got, before, floor)
			}
		}
		return fault
	}
	for step := 0; step < 400; step++ {
		// Finish some running requests, adversarially.
		keep := running[:0]
		for _, f := range running {
			if r.IntN(3) != 0 {
				keep = append(keep, f)
				continue
			}
			p.used -= f.tk.booking()
			unsettled[f.tk.Tenant] -= f.charge
			switch k := r.IntN(10); {
			case k < 6: // a short reply: a few tokens of a generous reservation
				q.Settle(f.tk, min(f.tk.Tokens, int64(1+r.IntN(8))))
			case k < 8: // a disconnect mid-reply: what it produced so far
				q.Settle(f.tk, r.Int64N(f.tk.Tokens+1))
			case k < 9: // an engine error: no usage known
				q.Settle(f.tk, -1)
			default: // settled at the whole reservation
				q.Settle(f.tk, f.tk.Tokens)
			}
		}
		running = keep
		for n := range weight {
			s := settledOf(n)
			if s < settledSeen[n]-1e-6 {
				return fmt.Errorf("step %d: %s's settled counter fell from %.1f to %.1f", step, n, settledSeen[n], s)
			}
			settledSeen[n] = s
		}
		// Heavy tenants: generous bookings, bursts of tiny requests.
		for _, n := range heavy {
			for i := r.IntN(3); i > 0; i-- {
				tokens := int64(1 + r.IntN(int(p.size)))
				if r.IntN(4) == 0 {
					tokens = int64(1 + r.IntN(4)) // tiny
				}
				tk := &Ticket{Tenant: n, Tokens: tokens, Weight: weight[n]}
				if wholePool {
					tk.Pool = p.size
					if r.IntN(3) == 0 {
						tk.Tokens = p.size + r.Int64N(p.size/2) // prompt + max_tokens over the pool
					}
				}
				if err := submit(tk); err != nil {
					return fmt.Errorf("step %d: %w", step, err)
				}
			}
		}
		// Interactive tenants: one small request at a time.
		for _, n := range light {
			if len(waiting[n]) == 0 && unsettled[n] == 0 && r.IntN(2) == 0 {
				if err := submit(&Ticket{Tenant: n, Tokens: int64(1 + r.IntN(int(p.size)/20+1)), Weight: weight[n]}); err != nil {
					return fmt.Errorf("step %d: %w", step, err)
				}
			}
		}
		// Clients leave while waiting.
		for n, w := range waiting {
			if len(w) > 0 && r.IntN(8) == 0 {
				tk := w[r.IntN(len(w))]
				if q.Cancel(tk) {
					waiting[n] = removeTicket(w, tk)
					keepW := watches[:0]
					for _, wa := range watches {
						if wa.tk != tk {
							keepW = append(keepW, wa)
						}
					}
					watches = keepW
				}
			}
		}
		q.Dispatch(fits)
		if fault != nil {
			return fmt.Errorf("step %d: %w", step, fault)
		}
	}
	return nil
}

func removeTicket(w []*Ticket, tk *Ticket) []*Ticket {
	for i, x := range w {
		if x == tk {
			return append(w[:i:i], w[i+1:]...)
		}
	}
	return w
}
