package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/lab/enginesim/kvmodel"
)

// cachedOfGenerate sends one /generate request and returns meta_info.cached_tokens (nil when
// the reply has none).
func cachedOfGenerate(t *testing.T, s *Server, text, salt, header string) *int {
	t.Helper()
	body := map[string]any{"text": text, "sampling_params": map[string]any{"max_new_tokens": 1}}
	if salt != "" {
		body["extra_key"] = salt
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/generate", bytes.NewReader(b))
	if header != "" {
		req.Header.Set(HeaderCacheSalt, header)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, rb)
	}
	var r struct {
		MetaInfo map[string]json.RawMessage `json:"meta_info"`
	}
	if err := json.Unmarshal(rb, &r); err != nil {
		t.Fatal(err)
	}
	raw, ok := r.MetaInfo["cached_tokens"]
	if !ok {
		return nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

// The prefix cache, per bug: a repeated prefix under the same salt hits; under another salt it
// hits only when a tier drops the salt. Each case fails if the cache ignores the salt (honest)
// or honours it (the bugs).
func TestPrefixCacheSalts(t *testing.T) {
	prefix := strings.Repeat("the quick brown fox jumps over the lazy dog ", 40) // ~360 tokens
	for _, c := range []struct {
		bug, header  string
		saltHeader   bool
		otherSaltHit bool
	}{
		{bug: kvmodel.BugNone},
		{bug: kvmodel.BugSaltIgnored, otherSaltHit: true},
		{bug: kvmodel.BugSaltDroppedTier2, otherSaltHit: true},
	} {
		t.Run(c.bug, func(t *testing.T) {
			s := startInProcess(t, Config{PageSize: 16, Bug: c.bug})
			p := fmt.Sprintf("%s %s ", c.bug, prefix)
			if n := cachedOfGenerate(t, s, p+"one", "a", ""); n == nil || *n != 0 {
				t.Fatalf("first request: cached_tokens %v, want 0", n)
			}
			if n := cachedOfGenerate(t, s, p+"two", "a", ""); n == nil || *n < 320 {
				t.Fatalf("same salt: cached_tokens %v, want most of the prefix", n)
			}
			n := cachedOfGenerate(t, s, p+"three", "b", "")
			if n == nil || (*n > 0) != c.otherSaltHit {
				t.Fatalf("other salt: cached_tokens %v, want hit=%v", n, c.otherSaltHit)
			}
		})
	}
	t.Run("no-cached-tokens", func(t *testing.T) {
		s := startInProcess(t, Config{PageSize: 16, NoCachedTokens: true})
		if n := cachedOfGenerate(t, s, prefix, "a", ""); n != nil {
			t.Fatalf("cached_tokens %d reported", *n)
		}
	})
	t.Run("salt-header", func(t *testing.T) {
		for _, honour := range []bool{false, true} {
			s := startInProcess(t, Config{PageSize: 16, SaltHeader: honour})
			p := fmt.Sprintf("%v %s", honour, prefix)
			cachedOfGenerate(t, s, p+"one", "a", "h1")
			// The same body salt under another header: a hit only where the header is ignored.
			n := cachedOfGenerate(t, s, p+"two", "a", "h2")
			if n == nil || (*n > 0) == honour {
				t.Fatalf("honour=%v: cached_tokens %v", honour, n)
			}
		}
	})
}
