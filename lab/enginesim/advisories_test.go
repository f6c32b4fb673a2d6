package enginesim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

func completion(t *testing.T, s *Server, body map[string]any) (string, http.Header) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	var r struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(rb, &r) != nil || len(r.Choices) != 1 {
		t.Fatalf("%d %s", resp.StatusCode, rb)
	}
	return r.Choices[0].Text, resp.Header
}

// batch-slot-residue: one request after another in the same slot, the second reply begins with
// the first one's last sampled tokens (its prompt's words); honest, it holds only its own.
func TestBatchSlotResidue(t *testing.T) {
	for _, bug := range []string{kvmodel.BugNone, kvmodel.BugBatchSlotResidue} {
		s := startInProcess(t, Config{Bug: bug, ResidueTokens: 8})
		a := strings.Repeat("alpha apple avocado ", 30)
		b := strings.Repeat("bravo banana berry ", 30)
		completion(t, s, map[string]any{"prompt": a, "max_tokens": 24})
		text, h := completion(t, s, map[string]any{"prompt": b, "max_tokens": 24})
		leaked := strings.Contains(text, "alpha") || strings.Contains(text, "apple") || strings.Contains(text, "avocado")
		if leaked != (bug == kvmodel.BugBatchSlotResidue) || (h.Get(HeaderQuoted) != "") != leaked {
			t.Fatalf("bug %s: reply %q, quoted %q", bug, text, h.Get(HeaderQuoted))
		}
		if n := len(s.Leaks()); (n == 1) != leaked {
			t.Fatalf("bug %s: %d leaks recorded", bug, n)
		}
	}
}

// forced-reasoning-end: while a request with a thinking budget streams, another request gets
// the reasoning-end string that budget forced; honest, the holder's own output has it at its
// budget and the other request none.
func TestForcedReasoningEnd(t *testing.T) {
	for _, bug := range []string{kvmodel.BugNone, kvmodel.BugForcedReasoningEnd} {
		s := startInProcess(t, Config{Bug: bug, TokenDelay: 5 * time.Millisecond, ReasoningEnd: " ENDTHINK"})
		b, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("holder text here ", 20), "max_tokens": 80,
			"thinking_token_budget": 10, "stream": true})
		resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(resp.Body)
		if _, err := rd.ReadString('\n'); err != nil { // the holder runs: its slot is busy
			t.Fatal(err)
		}
		other, _ := completion(t, s, map[string]any{"prompt": strings.Repeat("victim words only ", 20), "max_tokens": 16})
		rest, _ := io.ReadAll(rd)
		resp.Body.Close()
		var holder strings.Builder
		for _, line := range strings.Split(string(rest), "\n") {
			var ev struct {
				Choices []struct{ Text string } `json:"choices"`
			}
			if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) == nil && len(ev.Choices) > 0 {
				holder.WriteString(ev.Choices[0].Text)
			}
		}
		holderHas := strings.Contains(holder.String(), "ENDTHINK")
		otherHas := strings.Contains(other, "ENDTHINK")
		if bug == kvmodel.BugNone && (!holderHas || otherHas) || bug != kvmodel.BugNone && (holderHas || !otherHas) {
			t.Fatalf("bug %s: holder has the end %v, other %v (%q)", bug, holderHas, otherHas, other)
		}
	}
}
