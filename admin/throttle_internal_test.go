package admin

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/config"
)

var testSchedule = config.AuthThrottle{FreeFailures: 5, Backoff: time.Second, LockoutAfter: 10, Lockout: 15 * time.Minute, MaxAddresses: 4}

// The schedule, on a clock of our own: FreeFailures failures wait for nothing, each further one
// doubles the wait from Backoff, failure LockoutAfter locks the address out for Lockout, and a
// guesser that always waits its turn gets exactly LockoutAfter keys checked.
func TestThrottleSchedule(t *testing.T) {
	th := NewThrottle(testSchedule, nil)
	a := netip.MustParseAddr("192.0.2.1")
	now := time.Unix(1_800_000_000, 0)
	wantWaits := []time.Duration{0, 0, 0, 0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 15 * time.Minute}
	checked := 0
	for i := 0; i < 200; i++ {
		if w := th.Wait(a, now); w > 0 {
			now = now.Add(w) // a patient guesser
			if checked == testSchedule.LockoutAfter {
				break
			}
		}
		checked++
		th.Fail(a, ViaLogin, now)
		if got := th.Wait(a, now); got != wantWaits[checked-1] {
			t.Fatalf("after failure %d: wait %s, want %s", checked, got, wantWaits[checked-1])
		}
	}
	if checked != testSchedule.LockoutAfter {
		t.Fatalf("%d keys checked before the lockout, want %d", checked, testSchedule.LockoutAfter)
	}
	var m dto.Metric
	if err := th.failures.WithLabelValues(ViaLogin).Write(&m); err != nil || m.GetCounter().GetValue() != float64(testSchedule.LockoutAfter) {
		t.Fatalf("failures metric %v %v", m.GetCounter().GetValue(), err)
	}
	// Another address is not held by this one's lockout.
	if w := th.Wait(netip.MustParseAddr("192.0.2.2"), now); w != 0 {
		t.Fatalf("a bystander waits %s", w)
	}
	// After the lockout and Lockout without a failure the slate is clean: FreeFailures again.
	now = now.Add(testSchedule.Lockout + time.Second)
	for i := 0; i < testSchedule.FreeFailures-1; i++ {
		th.Fail(a, ViaBearer, now)
	}
	if w := th.Wait(a, now); w != 0 {
		t.Fatalf("failures not forgotten after the lockout: wait %s", w)
	}
}

// IPv6 addresses count by their /64 (a host holds a whole one); IPv4-mapped IPv6 is the IPv4
// address.
func TestThrottleKeys(t *testing.T) {
	th := NewThrottle(testSchedule, nil)
	now := time.Unix(1_800_000_000, 0)
	for i := 0; i < testSchedule.LockoutAfter; i++ {
		th.Fail(netip.MustParseAddr(fmt.Sprintf("2001:db8:1:2::%x", i+1)), ViaLogin, now)
	}
	if th.Wait(netip.MustParseAddr("2001:db8:1:2:ffff::1"), now) != testSchedule.Lockout {
		t.Fatal("guesses from one /64 were not counted together")
	}
	if th.Wait(netip.MustParseAddr("2001:db8:1:3::1"), now) != 0 {
		t.Fatal("another /64 is held")
	}
	for i := 0; i < testSchedule.LockoutAfter; i++ {
		th.Fail(netip.MustParseAddr("::ffff:198.51.100.7"), ViaLogin, now)
	}
	if th.Wait(netip.MustParseAddr("198.51.100.7"), now) != testSchedule.Lockout {
		t.Fatal("an IPv4-mapped address is not its IPv4 address")
	}
}

// The table holds at most MaxAddresses addresses: once it is full of live entries, addresses
// not in it share one entry (guessing from many addresses is throttled as one), and stale
// entries make room again.
func TestThrottleIsBounded(t *testing.T) {
	th := NewThrottle(testSchedule, prometheus.NewRegistry())
	now := time.Unix(1_800_000_000, 0)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }
	for i := 0; i < 1000; i++ {
		th.Fail(addr(i), ViaBearer, now)
	}
	if n := th.Len(); n != testSchedule.MaxAddresses {
		t.Fatalf("table holds %d addresses, cap %d", n, testSchedule.MaxAddresses)
	}
	// 996 failures from addresses beyond the cap landed on the shared entry: locked out.
	if w := th.Wait(addr(5000), now); w != testSchedule.Lockout {
		t.Fatalf("a new address while the table is full waits %s", w)
	}
	// Addresses in the table keep their own count (one failure: no wait).
	if w := th.Wait(addr(0), now); w != 0 {
		t.Fatalf("a tracked address waits %s", w)
	}
	// Once the tracked addresses' failures are stale, a new failure makes room for its address.
	now = now.Add(testSchedule.Lockout + time.Second)
	th.Fail(addr(7000), ViaBearer, now)
	if n := th.Len(); n != 1 {
		t.Fatalf("stale entries not swept: %d", n)
	}
	if w := th.Wait(addr(7001), now); w != 0 {
		t.Fatalf("the shared entry outlived its lockout: %s", w)
	}
}
