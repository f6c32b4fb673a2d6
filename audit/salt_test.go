package audit

import "testing"

func ip(n int) *int { return &n }

// The verdict from three cached-token figures: never isolated without a figure or without a hit
// under the same salt; only what goes beyond a new prompt's own figure counts.
func TestSaltVerdict(t *testing.T) {
	for _, c := range []struct {
		first, same, other *int
		want               string
	}{
		{ip(0), ip(576), ip(0), SaltIsolated},
		{ip(1), ip(600), ip(1), SaltIsolated}, // a BOS token shared with everything
		{ip(0), ip(576), ip(576), SaltShared},
		{ip(0), ip(576), ip(64), SaltShared},
		{nil, nil, nil, SaltUnknown},
		{ip(0), ip(576), nil, SaltUnknown},
		{ip(0), ip(0), ip(0), SaltUnknown}, // no cache to test
		{ip(5), ip(5), ip(0), SaltUnknown},
	} {
		if got, _ := saltVerdict(c.first, c.same, c.other); got != c.want {
			t.Errorf("saltVerdict(%v, %v, %v) = %s, want %s", c.first, c.same, c.other, got, c.want)
		}
	}
	for _, c := range []struct {
		first, sameHeader, otherHeader int
		want                           string
	}{
		{0, 576, 0, HeaderIsolated},
		{0, 0, 576, HeaderIgnored},
		{0, 576, 576, HeaderShared},
		{0, 0, 0, SaltUnknown},
	} {
		if got := headerVerdict(c.first, c.sameHeader, c.otherHeader); got != c.want {
			t.Errorf("headerVerdict(%d, %d, %d) = %s, want %s", c.first, c.sameHeader, c.otherHeader, got, c.want)
		}
	}
}

func TestCachedTokens(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want *int
	}{
		{`{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":64}}}`, ip(64)},
		{`{"text":"x","meta_info":{"cached_tokens":0}}`, ip(0)},
		{`{"usage":{"prompt_tokens":9}}`, nil},
		{`{"usage":{"prompt_tokens_details":null}}`, nil},
		{`not json`, nil},
	} {
		got := cachedTokens([]byte(c.raw))
		if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
			t.Errorf("cachedTokens(%s) = %v, want %v", c.raw, got, c.want)
		}
	}
}
