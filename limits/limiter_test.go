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

// Owing (issue 37): at tpm 20000, a request reserving a 65,536-token context with only its
// 200-token prompt bound to fit passes an empty cell and leaves the tenant owing the rest.
// Nothing passes until that is repaid, by refill (at exactly RetryAfter, not a millisecond
// before) or by the settlement's refund, so the overshoot is one request's. A request whose
// part that must fit exceeds the whole bucket never passes, and says so with no RetryAfter.
func TestOwingIsBoundedByOneRequest(t *testing.T) {
	m, clock := memoryAt(time.Unix(1_800_000_000, 0))
	lim := Rates{TPM: 20000}
	owing := Admission{Tenant: "a", Rates: lim, Tokens: 65536, Owable: 65536 - 200}
	v, _ := m.Admit(context.Background(), owing)
	if !v.Allowed || v.TPMFill != 65536*3 {
		t.Fatalf("an owing request on an empty cell: %+v", v)
	}
	small := Admission{Tenant: "a", Rates: lim, Tokens: 1}
	for _, a := range []Admission{small, owing} {
		v, _ = m.Admit(context.Background(), a)
		if v.Allowed || v.Never || v.Limit != TPM {
			t.Fatalf("a request while the tenant owes: %+v", v)
		}
	}
	// The owing request's 200 fit once the cell is back to 60 s - 600 ms of fill.
	wait := time.Duration(65536*3+200*3-60000) * time.Millisecond
	if v.RetryAfter != wait {
		t.Fatalf("RetryAfter %s, want %s", v.RetryAfter, wait)
	}
	clock.t = clock.t.Add(wait - time.Millisecond)
	if v, _ = m.Admit(context.Background(), owing); v.Allowed {
		t.Fatalf("passed before the debt was repaid: %+v", v)
	}
	clock.t = clock.t.Add(time.Millisecond)
	if v, _ = m.Admit(context.Background(), owing); !v.Allowed {
		t.Fatalf("refused at RetryAfter: %+v", v)
	}
	// Or the reply used 2,200 of its 65,536: the refund repays the debt at once.
	owing.Tenant = "c"
	if v, _ = m.Admit(context.Background(), owing); !v.Allowed {
		t.Fatalf("%+v", v)
	}
	if err := m.Settle(context.Background(), "c", lim, 2200-65536, ""); err != nil {
		t.Fatal(err)
	}
	if v, _ = m.Admit(context.Background(), Admission{Tenant: "c", Rates: lim, Tokens: 17800}); !v.Allowed {
		t.Fatalf("after the refund 2,200 of 20,000 are used, so 17,800 fit: %+v", v)
	}
	// Never: what must fit is more than the whole bucket, owable or not.
	for _, a := range []Admission{{Tokens: 20001}, {Tokens: 65536, Owable: 65536 - 20001}} {
		a.Tenant, a.Rates = "b", lim
		if v, _ = m.Admit(context.Background(), a); v.Allowed || !v.Never || v.RetryAfter != 0 || v.Limit != TPM {
			t.Fatalf("%+v: %+v, want Never with no RetryAfter", a, v)
		}
	}
	if v, _ = m.Admit(context.Background(), Admission{Tenant: "b", Rates: lim, Tokens: 65536, Owable: 65536 - 20000}); !v.Allowed {
		t.Fatalf("exactly the bucket must fit an empty cell: %+v", v)
	}
}

// The limiter passes owable through, and clamps it to the reservation.
func TestLimiterAdmitOwing(t *testing.T) {
	l := NewLimiter(nil, 1, 0)
	lim := Rates{TPM: 1000}
	tk, v := l.AdmitOwing("a", lim, 5000, 4900)
	if !v.Allowed || tk.Reserved() != 5000 {
		t.Fatalf("owing: %+v reserved %d", v, tk.Reserved())
	}
	if _, v = l.Admit("a", lim, 1); v.Allowed {
		t.Fatal("the tenant owes: nothing passes")
	}
	l.Settle(tk, 100)
	if _, v = l.Admit("a", lim, 800); !v.Allowed {
		t.Fatalf("after the refund: %+v", v)
	}
	if _, v = l.AdmitOwing("b", lim, 1500, 9999); !v.Allowed {
		t.Fatalf("owable beyond the reservation counts as all of it: %+v", v)
	}
	if _, v = l.AdmitOwing("c", lim, 1500, -5); v.Allowed || !v.Never {
		t.Fatalf("a negative owable is none: %+v", v)
	}
}
