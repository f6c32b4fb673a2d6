package hf

import (
	"sort"
	"strings"
)

// TemplateVariables lists the names the chat template reads that it does not define itself:
// its inputs (messages, tools, add_generation_prompt, bos_token…) and the switches it reads from
// chat_template_kwargs (enable_thinking, reasoning_effort…). Read from the template's source,
// not by rendering: every identifier inside {{ }} and {% %} that is not an attribute, a keyword,
// a filter or test, a builtin, or a name the template sets (set, for, macro parameters). It may
// list a name the template reads only where it has shadowed it, never misses one it reads.
func (t *Tokenizer) TemplateVariables() []string { return t.vars }

// templateVariables scans source for the free names of its expressions.
func templateVariables(source string) []string {
	read, defined := map[string]bool{}, map[string]bool{}
	for rest := source; ; {
		i := strings.Index(rest, "{")
		if i < 0 || i+1 >= len(rest) {
			break
		}
		var end string
		switch rest[i+1] {
		case '{':
			end = "}}"
		case '%':
			end = "%}"
		default:
			rest = rest[i+1:]
			continue
		}
		body := rest[i+2:]
		j := strings.Index(body, end)
		if j < 0 {
			j = len(body)
		}
		exprNames(body[:j], read, defined)
		if j+2 > len(body) {
			break
		}
		rest = body[j+2:]
	}
	var out []string
	for n := range read {
		if !defined[n] && !jinjaWords[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// exprNames adds the names one tag's expression reads to read, and those it binds to defined.
func exprNames(expr string, read, defined map[string]bool) {
	expr = strings.Trim(expr, "-+ \t\r\n")
	var prev string // the previous token (".", "|", "is", "set", "for", a name…)
	var idents []string
	first := ""
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' {
					j++
				}
				j++
			}
			i = j + 1
			prev = "str"
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j] >= 'a' && expr[j] <= 'z' || expr[j] >= 'A' && expr[j] <= 'Z' || expr[j] >= '0' && expr[j] <= '9') {
				j++
			}
			name := expr[i:j]
			if first == "" {
				first = name
			}
			// A keyword argument (name=value) names a parameter, not a variable.
			k := j
			for k < len(expr) && expr[k] == ' ' {
				k++
			}
			kwarg := k < len(expr) && expr[k] == '=' && (k+1 >= len(expr) || expr[k+1] != '=')
			switch {
			case prev == "." || prev == "|" || prev == "is" || prev == "not" && len(idents) > 0 && idents[len(idents)-1] == "is":
				// an attribute, a filter or a test
			case kwarg && prev != "set":
			default:
				idents = append(idents, name)
			}
			prev = name
			i = j
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++ // spaces separate tokens; the previous one still counts
		case c >= '0' && c <= '9':
			for i < len(expr) && (expr[i] >= '0' && expr[i] <= '9' || expr[i] == '.') {
				i++
			}
			prev = "num"
		default:
			prev = string(c)
			i++
		}
	}
	switch first {
	case "set":
		// {% set a = … %}, {% set a, b = … %}, {% set ns.x = … %}: the targets before '='.
		if eq := strings.Index(expr, "="); eq > 0 {
			for _, target := range strings.Split(expr[len("set"):eq], ",") {
				if name := strings.TrimSpace(target); name != "" && !strings.Contains(name, ".") {
					defined[name] = true
				}
			}
		} else if name := strings.TrimSpace(expr[len("set"):]); name != "" {
			defined[name] = true // a block set
		}
	case "for":
		if in := strings.Index(expr, " in "); in > 0 {
			for _, target := range strings.Split(expr[len("for"):in], ",") {
				defined[strings.Trim(target, " ()")] = true
			}
		}
	case "macro":
		open := strings.Index(expr, "(")
		if open > 0 {
			defined[strings.TrimSpace(expr[len("macro"):open])] = true
			for _, p := range strings.Split(strings.TrimSuffix(strings.TrimSpace(expr[open+1:]), ")"), ",") {
				name, _, _ := strings.Cut(p, "=")
				defined[strings.TrimSpace(name)] = true
			}
		}
	}
	for _, n := range idents {
		read[n] = true
	}
}

// jinjaWords are keywords, literals and builtins: never a template's input.
var jinjaWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`if elif else endif for endfor in not and or is set endset macro endmacro call
		endcall filter endfilter raw endraw block endblock extends include import from as with endwith recursive
		true false none True False None loop namespace range dict lipsum cycler joiner raise_exception strftime_now
		break continue do`) {
		m[w] = true
	}
	return m
}()
