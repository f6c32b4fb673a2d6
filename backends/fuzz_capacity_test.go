package backends

import (
	"encoding/json"
	"math"
	"testing"
)

// The capacity parsers read engine bytes, which kvgate does not trust. FuzzDecodeCapacity,
// FuzzSumField and FuzzSumGauge: no input panics; a reading is only accepted with the three
// numbers present, every limit positive, and admission bounded by the pool and by SGLang's own
// max_req_input_len for that pool and context; used-token sums are never negative (a negative load would make a lying
// engine the least loaded and attract every request).

func FuzzDecodeCapacity(f *testing.F) {
	f.Add([]byte(`{"max_total_num_tokens":4096,"max_req_input_len":4090,"page_size":16,"disaggregation_mode":"null"}`),
		[]byte(`{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`))
	f.Add([]byte(`{"max_total_num_tokens":4096}`), []byte(`{"data":[]}`))
	f.Add([]byte(`{"max_total_num_tokens":"4096","max_req_input_len":1e3}`), []byte(`{"data":[{"max_model_len":null}]}`))
	f.Add([]byte(`<html>`), []byte(``))
	f.Add([]byte(`{"max_total_num_tokens":4006,"max_req_input_len":100000,"context_length":50,"internal_states":[{"memory_usage":{"token_capacity":3}}]}`),
		[]byte(`{"data":[{"id":"m","max_model_len":100000},{"id":"n","max_model_len":7}]}`))
	f.Add([]byte(`{"max_total_num_tokens":1,"max_req_input_len":1}`), []byte(`{"data":[{"max_model_len":1}]}`))
	f.Add([]byte(`{"max_total_num_tokens":-1,"max_req_input_len":-7,"disaggregation_bootstrap_port":99999999999}`),
		[]byte(`{"data":[{"id":"","max_model_len":-1}]}`))
	f.Fuzz(func(t *testing.T, info, models []byte) {
		c, err := decodeCapacity(info, models)
		if err != nil {
			return
		}
		var raw struct {
			P *json.RawMessage `json:"max_total_num_tokens"`
			M *json.RawMessage `json:"max_req_input_len"`
		}
		if json.Unmarshal(info, &raw) != nil || raw.P == nil || raw.M == nil {
			t.Fatalf("accepted a reading without its numbers: %q", info)
		}
		if c.UsedTokens != -1 {
			t.Fatalf("used tokens before /v1/loads was read: %d", c.UsedTokens)
		}
		if c.PoolTokens < 1 || c.ContextLen < 1 || c.PoolTokens > maxCapacity || c.ContextLen > maxCapacity || c.PageSize < 1 || c.PageSize >= c.PoolTokens {
			t.Fatalf("a limit out of range: %+v", c)
		}
		if c.MaxReqInputLen > DerivedMaxReqInputLen(c.PoolTokens, c.ContextLen) && c.MaxReqInputLen > 0 || c.MaxReqInputLen < 0 {
			t.Fatalf("max_req_input_len %d not bounded by pool %d and context %d", c.MaxReqInputLen, c.PoolTokens, c.ContextLen)
		}
		if c.Inconsistent() && !c.PoolAlarm() {
			t.Fatalf("inconsistent reading without the alarm: %+v", c)
		}
		if c.BootstrapPort < 0 || c.BootstrapPort > 65535 {
			t.Fatalf("port %d", c.BootstrapPort)
		}
	})
}

func FuzzSumField(f *testing.F) {
	for _, s := range []string{
		`{"loads":[{"num_used_tokens":3},{"num_used_tokens":4}]}`, `[{"num_used_tokens":5}]`,
		`{"num_used_tokens":-9}`, `{"num_used_tokens":1e300}`, `{"a":{"num_used_tokens":2.5}}`,
		`{"num_used_tokens":"7"}`, `not json`, `[[[[{"num_used_tokens":1}]]]]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, ok := sumField(b, "num_used_tokens")
		if n < 0 || !ok && n != 0 {
			t.Fatalf("%q: %d %v", b, n, ok)
		}
	})
}

func FuzzSumGauge(f *testing.F) {
	for _, s := range []string{
		"# HELP x\nsglang:num_used_tokens{a=\"}\"} 3\nsglang_num_used_tokens 4.0\n",
		"sglang:num_used_tokens NaN\n", "sglang:num_used_tokens +Inf\n", "sglang:num_used_tokens -5\n",
		"sglang:num_used_tokens 1e300\nsglang:num_used_tokens 1e300\n", "sglang:num_used_tokens{dp=\"0\"} 0x10\n",
		"sglang:num_used_tokens", "sglang:num_used_tokens{", "sglang:num_used_tokens_total 9\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, ok := sumGauge(b, "num_used_tokens")
		if n < 0 || !ok && n != 0 {
			t.Fatalf("%q: %d %v", b, n, ok)
		}
		if float64(n) > math.MaxInt64/2 {
			t.Fatalf("%q: %d", b, n)
		}
	})
}

// FuzzTokenizeCount: /tokenize's reply decides gray-zone admission. No input panics; a count is
// never negative or over the capacity bound, and agrees with the token list when both are given.
func FuzzTokenizeCount(f *testing.F) {
	for _, s := range []string{
		`{"tokens":[1,2,3],"count":3,"max_model_len":8192}`, `{"count":-5}`, `{"count":"12"}`, `{"count":1.5}`,
		`{"count":1e9}`, `{"tokens":[1,2],"count":1}`, `{"tokens":"abc"}`, `null`, `<html>`, `{"count":99999999999999999999}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := decodeTokenizeCount(b)
		if err != nil {
			return
		}
		if n < 0 || n > maxCapacity {
			t.Fatalf("%q: count %d", b, n)
		}
		var raw struct {
			Count  *json.RawMessage `json:"count"`
			Tokens []json.RawMessage
		}
		if json.Unmarshal(b, &raw) == nil && raw.Count != nil && string(*raw.Count) != "null" && raw.Tokens != nil && len(raw.Tokens) != n {
			t.Fatalf("%q: count %d disagrees with %d tokens", b, n, len(raw.Tokens))
		}
	})
}
