package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// fileError is one problem of the YAML file itself (an unknown key, a value of the wrong type),
// named by its YAML path, like tenants[1].max_concurent.
type fileError struct {
	path, msg string
	line      int
}

func (e fileError) Error() string {
	return fmt.Sprintf("config: %s: %s (line %d)", e.path, e.msg, e.line)
}

// checkTree walks the YAML tree n against the Go type t and returns every unknown key and every
// value that does not decode into its field, each with its path, in file order. It removes them
// from the tree, so that the decode that follows succeeds and validation can still report the
// rest of the file in the same run. yaml.v3's own errors name a line only (several keys of a
// flow mapping share one) and its first unknown key's type, never the path.
func checkTree(n *yaml.Node, t reflect.Type, path string) []fileError {
	errs, _ := walk(n, t, path)
	return errs
}

// walk is checkTree of one node; bad reports that the node itself cannot be decoded into t (the
// caller drops it), as opposed to errors inside it, already dropped there.
func walk(n *yaml.Node, t reflect.Type, path string) (errs []fileError, bad bool) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == 0 || n.Tag == "!!null" {
		return nil, false // an empty value leaves the field at its zero (its default)
	}
	here := func(msg string) ([]fileError, bool) {
		return []fileError{{path: pathOr(path), msg: msg, line: n.Line}}, true
	}
	switch {
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return here(fmt.Sprintf("must be a mapping of settings, got %s", describe(n)))
		}
		fields := yamlFields(t)
		kept := n.Content[:0:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" { // <<: *anchor, decoded by yaml.v3 itself
				kept = append(kept, k, v)
				continue
			}
			sub := joinPath(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				msg := "unknown key"
				if s := suggest(k.Value, fields); s != "" {
					msg += fmt.Sprintf("; did you mean %q?", s)
				} else {
					msg += " (known here: " + strings.Join(sortedKeys(fields), ", ") + ")"
				}
				errs = append(errs, fileError{path: sub, msg: msg, line: k.Line})
				continue
			}
			e, bad := walk(v, ft, sub)
			errs = append(errs, e...)
			if !bad {
				kept = append(kept, k, v) // a bad value is dropped: the field keeps its default
			}
		}
		n.Content = kept
		return errs, false
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return here(fmt.Sprintf("must be a list, got %s", describe(n)))
		}
		for i, item := range n.Content {
			e, bad := walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
			errs = append(errs, e...)
			if bad {
				// Replaced by an empty item, not removed nor nulled (yaml.v3 skips a null item),
				// so that the items after it keep their index in validation's errors.
				n.Content[i] = emptyOf(t.Elem())
			}
		}
		return errs, false
	default:
		if n.Kind != yaml.ScalarNode {
			return here(fmt.Sprintf("must be a single value (%s), got %s", kindName(t), describe(n)))
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			return here(fmt.Sprintf("%q is not %s", n.Value, kindName(t)))
		}
		return nil, false
	}
}

// emptyOf is a YAML node that decodes into t's zero value.
func emptyOf(t reflect.Type) *yaml.Node {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	case reflect.Slice:
		return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	case reflect.String:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str"}
	case reflect.Bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "false"}
	default:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: "0"}
	}
}

func pathOr(p string) string {
	if p == "" {
		return "(top level)"
	}
	return p
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps a struct's YAML keys to their field types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml.v3's default key
		}
		out[name] = f.Type
	}
	return out
}

func sortedKeys(m map[string]reflect.Type) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	default:
		return fmt.Sprintf("%q", n.Value)
	}
}

func kindName(t reflect.Type) string {
	switch {
	case t.String() == "time.Duration":
		return "a duration (like 2s, 500ms, 1h)"
	case t.Kind() == reflect.Bool:
		return "a boolean (true or false)"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "an integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	default:
		return "a string"
	}
}

// suggest is the known key closest to got, when it is close enough to be a typo: within a third
// of its length in edits (at least 1, at most 3), or got with its words in another order.
func suggest(got string, known map[string]reflect.Type) string {
	best, bestD := "", 1<<30
	for k := range known {
		d := editDistance(strings.ToLower(got), k)
		if d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	limit := min(3, max(1, len(got)/3))
	if bestD <= limit {
		return best
	}
	for k := range known { // max_tokens_default for default_max_tokens
		if sameWords(got, k) {
			return k
		}
	}
	return ""
}

func sameWords(a, b string) bool {
	wa, wb := strings.Split(strings.ToLower(a), "_"), strings.Split(b, "_")
	if len(wa) != len(wb) || len(wa) < 2 {
		return false
	}
	sort.Strings(wa)
	sort.Strings(wb)
	return reflect.DeepEqual(wa, wb)
}

// editDistance is the Levenshtein distance with adjacent transpositions counted as one edit.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
