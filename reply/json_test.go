package reply

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// stdDecode is encoding/json's reading of b (UseNumber), the reference for decodeStrict.
func stdDecode(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if len(bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, errTrailing
	}
	return v, nil
}

// stdEncode is encoding/json's canonical writing, the reference for canonicalJSON.
func stdEncode(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

var jsonSeeds = []string{
	`{"a":1,"b":[true,false,null,"x"],"c":{"d":-0.5e+10,"e":"\u004bVG-\n\t\"\\\/"}}`,
	`"\ud83d\ude00 \ud800 alone \udc00 x"`, `"\ud83d\u0041"`, "\"bad \xff utf8\"", `"\u2028\u2029<>&"`,
	`[]`, `{}`, `0`, `-0`, `1.5E3`, ` [ 1 , 2 ] `, `"é ñ 你好"`, `"\u0000\u001f"`,
	`{"a":1,"a":2}`, `{"a":1} x`, `{"a":}`, `[1,]`, `01`, `1.`, `.5`, `"\x"`, `"\u12"`, "\"a\nb\"", `tru`, `nul`,
	`{"a" 1}`, `[1 2]`, `{"a":1,}`, `"unterminated`, strings.Repeat("[", 300) + strings.Repeat("]", 300),
}

func checkAgainstStd(t *testing.T, in []byte) {
	got, shadowed, err := DecodeStrict(in)
	want, werr := stdDecode(in)
	if err != nil && !(err == errDuplicateKey) {
		if werr == nil && !errorsIsDepth(err) {
			t.Fatalf("%q: we refuse (%v), encoding/json reads %v", in, err, want)
		}
		return
	}
	if err == errDuplicateKey {
		if len(shadowed) == 0 {
			t.Fatalf("%q: duplicate without a shadowed value", in)
		}
		if werr != nil {
			t.Fatalf("%q: encoding/json refuses (%v) what we read", in, werr)
		}
	} else if werr != nil {
		t.Fatalf("%q: we read %v, encoding/json refuses: %v", in, got, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decoded %#v, encoding/json %#v", in, got, want)
	}
	if a, b := CanonicalJSON(got), stdEncode(got); !bytes.Equal(a, b) {
		t.Fatalf("%q: wrote %s, encoding/json %s", in, a, b)
	}
	// The output of a buffered reply is allocated (and charged) at jsonLen's size.
	if n, a := JSONLen(got), CanonicalJSON(got); n != len(a) {
		t.Fatalf("%q: jsonLen %d, canonicalJSON wrote %d bytes", in, n, len(a))
	}
	// With a budget that refuses nothing, decoding spends at least what the value holds.
	var spent int64
	if v, _, err := DecodeStrictSpending(in, func(n int64) bool { spent += n; return true }); err == nil && spent > 0 && spent < int64(len(CanonicalJSON(v)))/2 {
		t.Fatalf("%q: spent %d for %d bytes of value", in, spent, len(CanonicalJSON(v)))
	}
}

func errorsIsDepth(err error) bool { return err == errJSONDepth }

func TestJSONValueMatchesEncodingJSON(t *testing.T) {
	for _, s := range jsonSeeds {
		checkAgainstStd(t, []byte(s))
	}
	if _, sh, err := DecodeStrict([]byte(`{"t":"KVG-x","t":"hi","u":{"k":1,"k":2}}`)); err != errDuplicateKey || len(sh) != 4 {
		t.Fatalf("duplicates: %v %v", err, sh)
	}
	// A reply whose decoded value would pass the budget is refused before it is built.
	big := []byte(`{"a":"` + strings.Repeat("x", 1<<20) + `","b":[` + strings.Repeat("1,", 1<<16) + `1]}`)
	var spent int64
	if _, _, err := DecodeStrictSpending(big, func(n int64) bool { spent += n; return spent <= 1<<20 }); err != ErrBudget {
		t.Fatalf("over budget: %v (spent %d)", err, spent)
	}
}

func FuzzJSONValue(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkAgainstStd(t, in)
	})
}
