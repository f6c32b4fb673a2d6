package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestDiffNamesChangesAndHidesSecrets(t *testing.T) {
	old, err := Parse([]byte(minimal+"  - {name: carol, key_sha256: \""+strings.Repeat("c", 64)+"\"}\ncanary: {secret: "+strings.Repeat("o", 32)+"}\nstate: {redis_url: \"redis://u:oldpw@127.0.0.1:6379/0\"}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := Parse([]byte(`
backends:
  - {name: sim, url: "http://127.0.0.1:30001", role: unified, api_key: topsecretkey}
tenants:
  - {name: alice, key_sha256: "`+key+`", rpm: 7}
  - {name: bob, key_sha256: "`+strings.Repeat("b", 64)+`"}
canary: {secret: `+strings.Repeat("n", 32)+`}
state: {redis_url: "redis://u:newpw@127.0.0.1:6379/0"}
policy: {mode: monitor}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := Diff(old, cur)
	want := []string{
		`backends[sim].url: "http://127.0.0.1:30000" → "http://127.0.0.1:30001"`,
		`backends[sim].api_key: changed (secret)`,
		`tenants[carol]: removed`,
		`tenants[alice].rpm: 0 → 7`,
		`tenants[bob]: added`,
		`policy.mode: "enforce" → "monitor"`,
		`state.redis_url: changed (secret)`,
		`canary.secret: changed (secret)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	all := strings.Join(got, "\n")
	for _, s := range []string{"topsecretkey", "oldpw", "newpw", strings.Repeat("n", 32), strings.Repeat("b", 64)} {
		if strings.Contains(all, s) {
			t.Errorf("secret %q in the diff", s)
		}
	}
	if d := Diff(cur, cur); len(d) != 0 {
		t.Errorf("no change, got %q", d)
	}
}
