package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Diff lists what changed from old to cur, one line per setting, by YAML path: "policy.mode:
// enforce → monitor"; list items that carry a name are matched by it ("tenants[bob].rpm: 5 → 10",
// "tenants[carol]: added"). Secrets never appear: a changed canary.secret, api_key, key hash or
// Redis password reads "changed (secret)", and a Redis URL is shown redacted.
func Diff(old, cur *Config) []string {
	var out []string
	diffValue(&out, "", reflect.ValueOf(*old), reflect.ValueOf(*cur), false)
	return out
}

// secretKeys are the settings whose values a log must not show.
var secretKeys = map[string]bool{"secret": true, "api_key": true, "key_sha256": true, "admin_key_sha256": true, "metrics_key_sha256": true}

func diffValue(out *[]string, path string, a, b reflect.Value, secret bool) {
	switch a.Kind() {
	case reflect.Struct:
		t := a.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if !f.IsExported() || name == "-" {
				continue
			}
			diffValue(out, joinPath(path, name), a.Field(i), b.Field(i), secretKeys[name])
		}
	case reflect.Pointer:
		switch {
		case a.IsNil() && b.IsNil():
		case a.IsNil():
			*out = append(*out, path+": added")
		case b.IsNil():
			*out = append(*out, path+": removed")
		default:
			diffValue(out, path, a.Elem(), b.Elem(), secret)
		}
	case reflect.Slice:
		if reflect.DeepEqual(a.Interface(), b.Interface()) {
			return
		}
		if an, bn, ok := byName(a), byName(b), a.Type().Elem().Kind() == reflect.Struct; ok && an != nil && bn != nil {
			for _, n := range sortedNames(an) {
				if _, still := bn[n]; !still {
					*out = append(*out, fmt.Sprintf("%s[%s]: removed", path, n))
				}
			}
			for _, n := range sortedNames(bn) {
				if av, was := an[n]; was {
					diffValue(out, fmt.Sprintf("%s[%s]", path, n), av, bn[n], secret)
				} else {
					*out = append(*out, fmt.Sprintf("%s[%s]: added", path, n))
				}
			}
			return
		}
		if secret || a.Type().Elem().Kind() == reflect.Struct {
			// Unnamed items are not matched one by one, and their fields may hold secrets.
			*out = append(*out, fmt.Sprintf("%s: changed (%d items → %d)", path, a.Len(), b.Len()))
			return
		}
		*out = append(*out, fmt.Sprintf("%s: %v → %v", path, a.Interface(), b.Interface()))
	default:
		if a.Interface() == b.Interface() {
			return
		}
		if secret {
			*out = append(*out, path+": changed (secret)")
			return
		}
		av, bv := fmt.Sprint(a.Interface()), fmt.Sprint(b.Interface())
		if path == "state.redis_url" {
			// The password (user part or query) is masked by Redacted's rule; if only it changed,
			// the two redacted URLs are equal and the line says so.
			av, bv = redactRedisURL(av), redactRedisURL(bv)
			if av == bv {
				*out = append(*out, path+": changed (secret)")
				return
			}
		}
		if a.Kind() == reflect.String {
			av, bv = fmt.Sprintf("%q", av), fmt.Sprintf("%q", bv)
		}
		*out = append(*out, fmt.Sprintf("%s: %s → %s", path, av, bv))
	}
}

// byName maps a list of structs by their Name field; nil when the items carry no unique,
// non-empty name (the list is then shown whole).
func byName(v reflect.Value) map[string]reflect.Value {
	if v.Type().Elem().Kind() != reflect.Struct {
		return nil
	}
	if _, ok := v.Type().Elem().FieldByName("Name"); !ok {
		return nil
	}
	m := make(map[string]reflect.Value, v.Len())
	for i := 0; i < v.Len(); i++ {
		n := v.Index(i).FieldByName("Name").String()
		if _, dup := m[n]; dup || n == "" {
			return nil
		}
		m[n] = v.Index(i)
	}
	return m
}

func sortedNames(m map[string]reflect.Value) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func redactRedisURL(u string) string {
	c := Config{State: State{RedisURL: u}}
	return c.Redacted().State.RedisURL
}
