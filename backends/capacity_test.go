package backends

import (
	"strings"
	"testing"
)

// Every number an engine sends is checked: a wrong type, sign, zero or out-of-range size makes
// the whole reading unknown (an error), never a 0 or a negative limit; limits stated twice take
// the smaller; a max_req_input_len larger than the pool and context allow is cut and flagged.
func TestDecodeCapacityValidates(t *testing.T) {
	const models = `{"object":"list","data":[{"id":"sim","max_model_len":8192}]}`
	info := func(fields string) string {
		return `{"max_total_num_tokens":4096,"max_req_input_len":4090,"page_size":16,"disaggregation_mode":"null"` + fields + `}`
	}
	good := []struct {
		name, info, models string
		pool, mril, ctx    int
		reported           int
	}{
		{"honest", info(""), models, 4096, 4090, 8192, 0},
		{"context flag null", info(`,"context_length":null`), models, 4096, 4090, 8192, 0},
		{"context flag smaller binds", info(`,"context_length":2048`), models, 4096, 2042, 2048, 4090},
		{"a rank's smaller pool binds", info(`,"internal_states":[{"memory_usage":{"token_capacity":4096}},{"memory_usage":{"token_capacity":1024}}]`), models,
			1024, 1018, 8192, 4090},
		{"internal_states without memory_usage", info(`,"internal_states":[{"page_size":16}]`), models, 4096, 4090, 8192, 0},
		{"several served models: the smallest context", info(""), `{"data":[{"id":"a","max_model_len":8192},{"id":"b","max_model_len":1000}]}`, 4096, 994, 1000, 4090},
		// Issue 15: max_req_input_len 100,000 over a 4,006-token pool.
		{"mril above the pool", `{"max_total_num_tokens":4006,"max_req_input_len":100000,"page_size":1}`, `{"data":[{"id":"m","max_model_len":100000}]}`, 4006, 4000, 100000, 100000},
		{"mril above the context", `{"max_total_num_tokens":1000000,"max_req_input_len":999994,"page_size":64}`, `{"data":[{"id":"m","max_model_len":4096}]}`, 1000000, 4090, 4096, 999994},
		{"smaller mril is kept", `{"max_total_num_tokens":4096,"max_req_input_len":100,"page_size":1}`, models, 4096, 100, 8192, 0},
	}
	for _, c := range good {
		got, err := decodeCapacity([]byte(c.info), []byte(c.models))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got.PoolTokens != c.pool || got.MaxReqInputLen != c.mril || got.ContextLen != c.ctx || got.ReportedMaxReqInputLen != c.reported {
			t.Errorf("%s: got pool %d mril %d ctx %d reported %d, want %d %d %d %d", c.name, got.PoolTokens, got.MaxReqInputLen,
				got.ContextLen, got.ReportedMaxReqInputLen, c.pool, c.mril, c.ctx, c.reported)
		}
		if got.Inconsistent() != (c.reported > 0) || got.Inconsistent() && !got.PoolAlarm() {
			t.Errorf("%s: an inconsistent reading raises the pool alarm: %+v", c.name, got)
		}
	}
	// num_reserved_decode_tokens: SGLang's default when absent, as given when an integer ≥ 0.
	for _, c := range []struct {
		info    string
		reserve int
	}{{info(""), 512}, {info(`,"num_reserved_decode_tokens":0`), 0}, {info(`,"num_reserved_decode_tokens":1024`), 1024}} {
		got, err := decodeCapacity([]byte(c.info), []byte(models))
		if err != nil || got.ReservedDecodeTokens != c.reserve {
			t.Errorf("%s: reserve %v (%v), want %d", c.info, got, err, c.reserve)
		}
	}
	// A rank's larger page binds (each rank's scheduler reserves its own page).
	for _, c := range []struct {
		info string
		page int
	}{{info(""), 16}, {info(`,"internal_states":[{"page_size":64},{"page_size":1}]`), 64}, {info(`,"internal_states":[{"page_size":null}]`), 16}} {
		got, err := decodeCapacity([]byte(c.info), []byte(models))
		if err != nil || got.PageSize != c.page {
			t.Errorf("%s: page %v (%v), want %d", c.info, got, err, c.page)
		}
	}
	// Every kind of wrong number, in every place a number is read.
	wrong := []string{`"4096"`, `4096.0`, `4e3`, `-4096`, `0`, `-0`, `true`, `null`, `{}`, `[4096]`, `1e300`, `99999999999999999999`, `1099511627777`}
	places := []struct{ name, info, models string }{
		{"max_total_num_tokens", `{"max_total_num_tokens":X,"max_req_input_len":4090,"page_size":16}`, models},
		{"max_req_input_len", `{"max_total_num_tokens":4096,"max_req_input_len":X,"page_size":16}`, models},
		{"max_model_len", info(""), `{"data":[{"id":"sim","max_model_len":X}]}`},
		{"second model's max_model_len", info(""), `{"data":[{"id":"sim","max_model_len":8192},{"id":"b","max_model_len":X}]}`},
		{"page_size", `{"max_total_num_tokens":4096,"max_req_input_len":4090,"page_size":X}`, models},
		{"context_length", info(`,"context_length":X`), models},
		{"token_capacity", info(`,"internal_states":[{"memory_usage":{"token_capacity":X}}]`), models},
		{"a rank's page_size", info(`,"internal_states":[{"page_size":X}]`), models},
		{"num_reserved_decode_tokens", info(`,"num_reserved_decode_tokens":X`), models},
	}
	for _, p := range places {
		for _, w := range wrong {
			optional := p.name == "context_length" || p.name == "token_capacity" || p.name == "second model's max_model_len" || p.name == "a rank's page_size" || p.name == "num_reserved_decode_tokens"
			if w == "null" && optional {
				continue // an optional field may be null
			}
			if (w == "0" || w == "-0") && p.name == "num_reserved_decode_tokens" {
				continue // no tokens reserved is a setting
			}
			c, err := decodeCapacity([]byte(strings.Replace(p.info, "X", w, 1)), []byte(strings.Replace(p.models, "X", w, 1)))
			if err == nil {
				t.Errorf("%s = %s accepted: %+v", p.name, w, c)
			}
		}
	}
	for _, c := range []struct{ name, info, models string }{
		{"not JSON", `<html>`, models}, {"a list", `[1]`, models}, {"null", `null`, models},
		{"mode not a string", info(`,"disaggregation_mode":7`), models},
		{"port out of range", info(`,"disaggregation_bootstrap_port":70000`), models},
		{"negative port", info(`,"disaggregation_bootstrap_port":-1`), models},
		{"internal_states not a list", info(`,"internal_states":{"a":1}`), models},
		{"no models", info(""), `{"data":[]}`}, {"models not JSON", info(""), `oops`},
		{"model id not a string", info(""), `{"data":[{"id":5,"max_model_len":8192}]}`},
		// The page size decides the schedulable edge (issue 39): unknown is no reading.
		{"no page_size", `{"max_total_num_tokens":4096,"max_req_input_len":4090}`, models},
		{"page_size as large as the pool", `{"max_total_num_tokens":4096,"max_req_input_len":4090,"page_size":4096}`, models},
		{"a rank's page as large as its pool", info(`,"internal_states":[{"page_size":1024,"memory_usage":{"token_capacity":1024}}]`), models},
	} {
		if got, err := decodeCapacity([]byte(c.info), []byte(c.models)); err == nil {
			t.Errorf("%s accepted: %+v", c.name, got)
		}
	}
}

// /tokenize's count decides admission in the gray zone: only a whole, non-negative integer
// (or the length of the token list, agreeing with the count when both are given) is a count.
func TestDecodeTokenizeCount(t *testing.T) {
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"tokens":[1,2,3],"count":3,"max_model_len":8192}`, 3},
		{`{"count":7}`, 7},
		{`{"tokens":[5,6]}`, 2},
		{`{"tokens":[],"count":0}`, 0},
	} {
		if n, err := decodeTokenizeCount([]byte(c.body)); err != nil || n != c.want {
			t.Errorf("%s: got %d %v, want %d", c.body, n, err, c.want)
		}
	}
	for _, body := range []string{
		`{"count":-5}`, `{"count":"12"}`, `{"count":1.5}`, `{"count":1e9}`, `{"count":true}`, `{"count":null}`,
		`{"count":99999999999999999999}`, `{"tokens":[1,2],"count":1}`, `{"tokens":"abc"}`, `{"tokens":{"a":1}}`,
		`{}`, `[]`, `null`, `<html>`, ``, `{"count":3`,
	} {
		if n, err := decodeTokenizeCount([]byte(body)); err == nil {
			t.Errorf("%s: accepted as %d", body, n)
		}
	}
}

// KVNeed caps a request's need at the pool of each engine (SGLang ends a reply at its pool) and
// names the engine the request fills the most: a prompt + max_tokens over the pool (issue 40's
// 30,019 against 20,000) books exactly the whole pool, which the queue then treats as large.
func TestKVNeedCapsAtThePool(t *testing.T) {
	backend := func(pool int) *Backend {
		b := &Backend{}
		if pool > 0 {
			SetCapacityForTest(b, &Capacity{PoolTokens: pool, ContextLen: 32768})
		}
		return b
	}
	for _, c := range []struct {
		name           string
		route          Route
		prompt, output int
		need, pool     int64
	}{
		{"fits", Route{Unified: backend(20000)}, 19, 1000, 1019, 20000},
		{"over the pool: the whole pool", Route{Unified: backend(20000)}, 19, 30000, 20000, 20000},
		{"decode binds", Route{Prefill: backend(20000), Decode: backend(8000)}, 500, 30000, 8000, 8000},
		{"prefill binds", Route{Prefill: backend(1000), Decode: backend(100000)}, 900, 100, 900, 1000},
		{"unknown pool", Route{Unified: backend(0)}, 19, 30000, 30019, 0},
	} {
		need, pool := c.route.KVNeed(c.prompt, c.output)
		if need != c.need || pool != c.pool {
			t.Errorf("%s: KVNeed = %d of %d, want %d of %d", c.name, need, pool, c.need, c.pool)
		}
	}
}
