package config

import (
	"reflect"
	"strings"
	"testing"
)

// Issue 51: a file's errors name their YAML path, suggest the key meant, and come all in one run.
func TestFileErrorsNamePathAndSuggest(t *testing.T) {
	y := `
listen: "127.0.0.1:8080"
max_body_bytse: 5
backends:
  - {name: a, url: "http://h:1", role: unified}
  - {name: b, url: "http://h:2", role: unified}
  - {name: c, url: "http://h:3", role: unified, modle: m}
tenants:
  - {name: alice, key_sha256: "` + key + `"}
  - {name: bob, key_sha256: "` + strings.Repeat("b", 64) + `", max_concurent: 3, rpm: lots}
policy:
  mdoe: monitor
  overflow_status: 422
  count_drift: {window: soon}
canary:
  fingerprint: {}
tokenizer: [x]
zzz_unrelated: 1
`
	_, err := Parse([]byte(y), nil)
	if err == nil {
		t.Fatal("accepted")
	}
	got := err.Error()
	want := []string{
		`config: max_body_bytse: unknown key; did you mean "max_body_bytes"? (line 3)`,
		`config: backends[2].modle: unknown key; did you mean "model"? (line 7)`,
		`config: tenants[1].max_concurent: unknown key; did you mean "max_concurrent"? (line 10)`,
		`config: tenants[1].rpm: "lots" is not an integer (line 10)`,
		`config: policy.mdoe: unknown key; did you mean "mode"? (line 12)`,
		`config: policy.count_drift.window: "soon" is not a duration (like 2s, 500ms, 1h) (line 14)`,
		`config: canary.fingerprint: unknown key; did you mean "fingerprints"? (line 16)`,
		`config: tokenizer: must be a mapping of settings, got a list (line 17)`,
		`config: zzz_unrelated: unknown key (known here: admin_key_sha256, backends,`,
		// Validation still runs over what was good in the file: the same pass names it.
		`config: policy.overflow_status: must be 413 or 400, got 422`,
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("missing %q in:\n%s", w, got)
		}
	}
	// The dropped window is not blamed again by validation (it saw the default, which is valid),
	// and each problem is reported once.
	if n := strings.Count(got, "\n") + 1; n != len(want) {
		t.Errorf("%d errors, want %d:\n%s", n, len(want), got)
	}
}

func TestFileErrorsKeepIndexes(t *testing.T) {
	// A bad list item is dropped in place: the item after it keeps its index in later errors.
	y := "backends:\n  - 5\n  - {name: b, url: \"nope\", role: unified}\n"
	_, err := Parse([]byte(y), nil)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{`config: backends[0]: must be a mapping of settings, got "5" (line 2)`, "config: backends[1].url: must be http://host:port"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	if strings.Contains(err.Error(), "backends[0].name") {
		t.Errorf("the dropped item is blamed again:\n%v", err)
	}
}

func TestSuggest(t *testing.T) {
	known := yamlFields(typeOf[Policy]())
	for got, want := range map[string]string{
		"mdoe": "mode", "overflowstatus": "overflow_status", "max_tokens_default": "default_max_tokens",
		"Mode": "mode", "isolaton": "isolation", "color": "", "x": "",
	} {
		if s := suggest(got, known); s != want {
			t.Errorf("suggest(%q) = %q, want %q", got, s, want)
		}
	}
}

func typeOf[T any]() reflect.Type { return reflect.TypeOf((*T)(nil)).Elem() }
