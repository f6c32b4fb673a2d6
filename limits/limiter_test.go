package limits

import (
	"context"
	"fmt"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (f *fakeClock) now() time.Time { return f.t }

func memoryAt(start time.Time) (*Memory, *fakeClock) {
	c := &fakeClock{t: start}
	m := NewMemory()
	m.now = c.now
	return m, c
}

// Both stores must give the same answers: the Lua script is gcra() rewritten. Redis uses its own
// clock, so these cases need no time to pass (refill is 3 s per request at rpm 20).
func TestMemoryRefillsWithTime(t *testing.T) {
	m, clock := memoryAt(time.Unix(1_800_000_000, 0))
	a := Admission{Tenant: "a", Rates: Rates{RPM: 60}}
	if n, _ := admitN(t, m, a, 70); n != 60 {
		t.Fatalf("burst = the per-minute limit: %d", n)
	}
	clock.t = clock.t.Add(2500 * time.Millisecond)
	if n, _ := admitN(t, m, a, 5); n != 2 {
		t.Fatalf("2.5 s at 1/s refills 2: %d", n)
	}
	clock.t = clock.t.Add(10 * time.Minute)
	if n, _ := admitN(t, m, a, 70); n != 60 {
		t.Fatalf("an idle minute refills the burst, never more: %d", n)
	}
}

func TestShare(t *testing.T) {
	got := Share(Rates{RPM: 20, TPM: 1001, MaxConcurrent: 1}, 2)
	if got != (Rates{RPM: 10, TPM: 500, MaxConcurrent: 1}) { // a limit below the replica count: 1 each, never 0
		t.Fatalf("Share = %+v", got)
	}
	if Share(Rates{}, 3) != (Rates{}) {
		t.Fatal("no limit stays no limit")
	}
}

// A limiter whose Redis does not answer decides locally at its share, within its timeout.
// Shared counting resumes after an outage without a burst: what the replica admitted alone is
// carried into the shared cell, and its local share started from how full the shared cell was.
func TestLimiterWithoutSharedStore(t *testing.T) {
	l := NewLimiter(nil, 3, 0)
	n := 0
	var tickets []*Ticket
	for i := 0; i < 10; i++ {
		tk, v := l.Admit("a", Rates{MaxConcurrent: 4}, 0)
		if v.Allowed {
			n++
			tickets = append(tickets, tk)
		}
	}
	if n != 4 {
		t.Fatalf("memory only enforces the whole limit, not a share: %d", n)
	}
	l.Settle(tickets[0], 0)
	l.Settle(tickets[0], 0) // twice: frees one slot only
	if _, v := l.Admit("a", Rates{MaxConcurrent: 4}, 0); !v.Allowed {
		t.Fatal("a settled ticket frees its slot")
	}
	if _, v := l.Admit("a", Rates{MaxConcurrent: 4}, 0); v.Allowed {
		t.Fatal("settling twice must not free two slots")
	}
	if tk, v := l.Admit("free", Rates{}, 100); tk != nil || !v.Allowed {
		t.Fatal("a tenant without limits is admitted without a ticket")
	}
}

func admitN(t *testing.T, s Store, a Admission, n int) (allowed int, last Verdict) {
	t.Helper()
	for i := 0; i < n; i++ {
		if a.Rates.MaxConcurrent > 0 {
			a.Lease = fmt.Sprintf("lease-%d", i)
		}
		v, err := s.Admit(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed {
			allowed++
		} else {
			last = v
		}
	}
	return allowed, last
}
