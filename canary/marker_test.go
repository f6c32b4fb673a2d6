package canary

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestMarkerFormat(t *testing.T) {
	m := Marker([]byte("s3cret"), "alice", 7)
	if len(m) != MarkerLen || !strings.HasPrefix(m, MarkerPrefix) {
		t.Fatalf("marker %q: want %q + 20 chars", m, MarkerPrefix)
	}
	for _, c := range m[4:] {
		if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyz234567", c) {
			t.Fatalf("marker %q has %q outside lowercase base32", m, c)
		}
	}
	if again := Marker([]byte("s3cret"), "alice", 7); again != m {
		t.Fatalf("not deterministic: %q then %q", m, again)
	}
}

// TestMarkerDefinition recomputes the marker from its written definition with the standard
// library, independently of markerInto.
func TestMarkerDefinition(t *testing.T) {
	secret := []byte("another secret")
	for _, tc := range []struct {
		tenant string
		epoch  uint64
	}{{"alice", 0}, {"bob", 493827}, {"", 1}, {"ünïcode-tenant", 1 << 40}} {
		var msg []byte
		msg = binary.BigEndian.AppendUint32(msg, uint32(len(tc.tenant)))
		msg = append(msg, tc.tenant...)
		msg = binary.BigEndian.AppendUint64(msg, tc.epoch)
		mac := hmac.New(sha256.New, secret)
		mac.Write(msg)
		sum := mac.Sum(nil)
		enc := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum))
		want := "KVG-" + enc[:20]
		if got := Marker(secret, tc.tenant, tc.epoch); got != want {
			t.Errorf("Marker(%q, %d) = %q, want %q", tc.tenant, tc.epoch, got, want)
		}
	}
}

func TestMarkerLengthPrefixSeparatesTenantsAndEpochs(t *testing.T) {
	secret := []byte("k")
	a := Marker(secret, "alice1", 2)
	b := Marker(secret, "alice", 12)
	if a == b {
		t.Fatalf("alice1/2 and alice/12 share marker %q", a)
	}
	if Marker(secret, "alice", 1) == Marker(secret, "alice", 2) {
		t.Fatal("epochs 1 and 2 share a marker")
	}
	if Marker([]byte("one"), "alice", 1) == Marker([]byte("two"), "alice", 1) {
		t.Fatal("different secrets give the same marker")
	}
}

func TestKeyringLookupCurrentAndRefresh(t *testing.T) {
	secret := []byte("ring")
	k := NewKeyring(secret, time.Hour, 3*time.Hour, []string{"alice", "bob"})
	now := time.Now()
	cur := k.Epoch(now)
	m, e := k.Current("alice", now)
	if e != cur || m != Marker(secret, "alice", cur) {
		t.Fatalf("Current = %q/%d, want %q/%d", m, e, Marker(secret, "alice", cur), cur)
	}
	// Live: the window back from now, and the next epoch (clock skew between replicas).
	for _, ep := range []uint64{k.Epoch(now.Add(-3 * time.Hour)), cur - 1, cur, cur + 1} {
		o, ok := k.Lookup(Marker(secret, "bob", ep))
		if !ok || o.Tenant != "bob" || o.Epoch != ep {
			t.Errorf("epoch %d (cur %d): Lookup = %+v, %v", ep, cur, o, ok)
		}
	}
	for _, ep := range []uint64{k.Epoch(now.Add(-3*time.Hour)) - 1, cur + 2} {
		if o, ok := k.Lookup(Marker(secret, "bob", ep)); ok {
			t.Errorf("epoch %d (cur %d) should not be live, got %+v", ep, cur, o)
		}
	}
	if _, ok := k.Lookup(Marker([]byte("other"), "bob", cur)); ok {
		t.Error("marker under another secret recognized")
	}
	if _, ok := k.Lookup(Marker(secret, "bob", cur)[:MarkerLen-1]); ok {
		t.Error("incomplete marker recognized by Lookup")
	}

	// Tenants added at run time become detectable at once, for every live epoch.
	if _, ok := k.Lookup(Marker(secret, "carol", cur-1)); ok {
		t.Fatal("carol known before AddTenant")
	}
	k.AddTenant("carol")
	if o, ok := k.Lookup(Marker(secret, "carol", cur-1)); !ok || o.Tenant != "carol" {
		t.Fatalf("carol after AddTenant: %+v %v", o, ok)
	}
	before := k.LiveMarkers()
	// 4 h later: epochs older than the window are dropped, new ones added; the count is stable.
	later := now.Add(4 * time.Hour)
	k.Refresh(later)
	if _, ok := k.Lookup(Marker(secret, "alice", cur)); ok {
		t.Error("epoch outside the window still live after Refresh")
	}
	if _, ok := k.Lookup(Marker(secret, "alice", k.Epoch(later)+1)); !ok {
		t.Error("next epoch not live after Refresh")
	}
	if after := k.LiveMarkers(); after != before {
		t.Errorf("live markers %d before, %d after a refresh that slides the window", before, after)
	}
	// Current for an unknown tenant adds it.
	m2, _ := k.Current("dave", later)
	if o, ok := k.Lookup(m2); !ok || o.Tenant != "dave" {
		t.Errorf("Current for a new tenant not detectable: %+v %v", o, ok)
	}
}

func TestFindMarkers(t *testing.T) {
	secret := []byte("find")
	k := NewKeyring(secret, time.Hour, 24*time.Hour, []string{"alice", "bob"})
	a, _ := k.Current("alice", time.Now())
	b, _ := k.Current("bob", time.Now())
	unknown := Marker([]byte("nope"), "alice", 1)
	text := "x " + a + " y" + b + a + " " + unknown + " " + b[:12] + " KVG-"
	got := k.FindMarkers(text)
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("FindMarkers = %q, want [%q %q]", got, a, b)
	}
	if got := k.FindMarkers("no markers here"); got != nil {
		t.Fatalf("FindMarkers on plain text = %q", got)
	}
}

func TestInjectSystemEndAndPrefix(t *testing.T) {
	m := Marker([]byte("x"), "alice", 1)
	if got := InjectSystemEnd("You are helpful.", m); got != "You are helpful.\n\n"+m {
		t.Errorf("InjectSystemEnd = %q", got)
	}
	if got := InjectSystemEnd("", m); got != m {
		t.Errorf("InjectSystemEnd on empty = %q", got)
	}
	if got := InjectPrefix("Once upon", m); got != m+"\n\nOnce upon" {
		t.Errorf("InjectPrefix = %q", got)
	}
}

func TestInjectEvery(t *testing.T) {
	m := Marker([]byte("x"), "alice", 1)
	words := strings.Repeat("lorem ipsum dolor ", 200) // 3600 bytes
	got := InjectEvery(words, m, 1000)
	if n := strings.Count(got, m); n != 3 {
		t.Errorf("%d repetitions in 3600 bytes every 1000, want 3", n)
	}
	if strings.ReplaceAll(got, m+" ", "") != words {
		t.Error("removing the repetitions does not give the original text back")
	}
	for i := 0; ; {
		j := strings.Index(got[i:], m)
		if j < 0 {
			break
		}
		p := i + j
		if p == 0 || !isSpace(got[p-1]) || !isSpace(got[p+len(m)]) {
			t.Fatalf("repetition at %d is not whitespace-delimited: %q", p, got[max(0, p-5):p+len(m)+5])
		}
		i = p + len(m)
	}
	if InjectEvery(words, m, 0) != words {
		t.Error("every_bytes 0 changed the text")
	}

	// No whitespace (Chinese): framed by its own spaces at a character boundary.
	zh := strings.Repeat("中文文本", 300) // 3600 bytes, 3-byte runes
	gz := InjectEvery(zh, m, 1000)
	if n := strings.Count(gz, " "+m+" "); n < 2 {
		t.Errorf("%d framed repetitions in Chinese text, want ≥ 2", n)
	}
	if strings.ReplaceAll(gz, " "+m+" ", "") != zh {
		t.Error("repetitions in Chinese text split a character or changed the text")
	}
	for _, f := range []string{gz, got} {
		if !utf8Valid(f) {
			t.Error("result is not valid UTF-8")
		}
	}
}

func utf8Valid(s string) bool { return utf8.ValidString(s) }

// TestKeyringConcurrentUse runs lookups, scans, Current and AddTenant while Refresh slides the
// window (run with -race).
func TestKeyringConcurrentUse(t *testing.T) {
	secret := []byte("conc")
	k := NewKeyring(secret, time.Hour, 4*time.Hour, []string{"alice", "bob"})
	now := time.Now()
	bob, _ := k.Current("bob", now)
	done := make(chan struct{})
	errs := make(chan string, 4)
	for g := 0; g < 2; g++ {
		go func() {
			s := k.NewScanner("alice", nil)
			for i := 0; ; i++ {
				select {
				case <-done:
					errs <- ""
					return
				default:
				}
				s.Reset("alice", nil)
				if _, v := s.Feed(nil, []byte("x "+bob+" y")); v.Leak == nil || v.Leak.Victim != "bob" {
					errs <- "bob's current marker not caught during a refresh"
					return
				}
				k.Current("alice", now)
				k.AddTenant("t" + string(rune('a'+i%26)))
			}
		}()
	}
	for i := 0; i < 50; i++ {
		// Slide within the window so bob's current marker stays live.
		k.Refresh(now.Add(time.Duration(i%3) * time.Hour))
	}
	close(done)
	for g := 0; g < 2; g++ {
		if e := <-errs; e != "" {
			t.Fatal(e)
		}
	}
}

// Scans never wait on a rebuild: while Refresh and AddTenant build and swap rings (run with
// -race), folded-text detectors and prefix scanners keep finding bob's live marker; and with the
// rebuild lock held (a rebuild in progress), a scan and a lookup still complete.
func TestScansDuringRebuild(t *testing.T) {
	k := NewKeyring([]byte("rebuild"), time.Hour, 4*time.Hour, []string{"alice", "bob"})
	now := time.Now()
	bob, _ := k.Current("bob", now)
	body := bob[len(MarkerPrefix):]
	done := make(chan struct{})
	errs := make(chan string, 2)
	for g := 0; g < 2; g++ {
		go func() {
			l := k.NewLoose("alice", nil)
			s := k.NewScanner("alice", nil)
			for i := 0; ; i++ {
				select {
				case <-done:
					errs <- ""
					return
				default:
				}
				l.Reset("alice", nil)
				if _, h := l.Feed(nil, []byte("quote: "+body[i%8:i%8+LooseMin]+" end")); h == nil || h.Victim != "bob" {
					errs <- fmt.Sprintf("a stretch of bob's marker was missed during a rebuild: %+v", h)
					return
				}
				s.Reset("alice", nil)
				if _, v := s.Feed(nil, []byte("x "+bob+" y")); v.Leak == nil {
					errs <- "bob's marker not caught by the prefix scanner during a rebuild"
					return
				}
			}
		}()
	}
	for i := 0; i < 30; i++ {
		k.Refresh(now.Add(time.Duration(i%3) * time.Hour))
		k.AddTenant(fmt.Sprintf("new%d", i))
	}
	close(done)
	for g := 0; g < 2; g++ {
		if e := <-errs; e != "" {
			t.Fatal(e)
		}
	}

	k.slow.Lock() // as Refresh holds it while it builds the next ring
	finished := make(chan bool)
	go func() {
		_, h := k.NewLoose("alice", nil).Feed(nil, []byte(body[:LooseMin]))
		_, ok := k.Lookup(bob)
		finished <- h != nil && ok
	}()
	select {
	case ok := <-finished:
		if !ok {
			t.Error("scan during a rebuild found nothing")
		}
	case <-time.After(10 * time.Second):
		t.Error("a scan waited on the rebuild lock")
	}
	k.slow.Unlock()
}
