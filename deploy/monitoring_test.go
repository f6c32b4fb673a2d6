// Package deploy_test checks the dashboards and alert rules in deploy/ against a running gateway:
// every metric they name must be exported on its /metrics, and the rules must load (promtool
// check rules and promtool test rules, with a strict YAML decoding that runs without promtool).
package deploy_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

var metricName = regexp.MustCompile(`\bkvgate_[a-z0-9_]+`)

// monitoringFiles are the dashboards and rule files (the rules' own test file included).
func monitoringFiles(t *testing.T) []string {
	dash, _ := filepath.Glob("grafana/*.json")
	rules, _ := filepath.Glob("prometheus/*.yaml")
	if len(dash) == 0 || len(rules) == 0 {
		t.Fatalf("want dashboards and rules, found %v %v", dash, rules)
	}
	return append(dash, rules...)
}

// namesIn is every kvgate_ metric name the file mentions, in queries or in prose.
func namesIn(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return metricName.FindAllString(string(b), -1)
}

// Every metric the dashboards and the rules name is exported by a real gateway that has seen a
// leak, quarantines, a 429 and refusals (histograms by their _bucket, _sum and _count series).
func TestDashboardsAndRulesNameExportedMetrics(t *testing.T) {
	scene := testkit.StartIncidentScene(t)
	req, _ := http.NewRequest("GET", scene.GW.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+scene.AdminKey) // /metrics needs a key by default (issue 31)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	exported := map[string]bool{}
	for name, mf := range families {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		exported[name] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
	}
	checked := map[string]bool{}
	missing := map[string][]string{}
	for _, f := range monitoringFiles(t) {
		for _, n := range namesIn(t, f) {
			checked[n] = true
			if !exported[n] {
				missing[n] = append(missing[n], f)
			}
		}
	}
	if len(checked) < 20 {
		t.Fatalf("only %d metric names found in the dashboards and rules: %v", len(checked), checked)
	}
	if len(missing) > 0 {
		names := make([]string, 0, len(missing))
		for n := range missing {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			t.Errorf("%s is named in %v but not exported on /metrics", n, missing[n])
		}
	}
	t.Logf("%d metric names checked against /metrics", len(checked))
}

// The rule file decoded strictly (an unknown key such as "experssion" fails), whether or not
// promtool is installed.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertRulesDecodeStrictly(t *testing.T) {
	files, _ := filepath.Glob("prometheus/*.yaml")
	var rules int
	for _, f := range files {
		if strings.HasSuffix(f, ".test.yaml") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		var rf ruleFile
		if err := dec.Decode(&rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				rules++
				if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("%s group %s: rule %q needs alert, expr, a severity and a summary", f, g.Name, r.Alert)
				}
			}
		}
	}
	if rules < 10 {
		t.Fatalf("%d rules found", rules)
	}
}

// promtoolBinary is promtool from PATH or $(go env GOPATH)/bin (.ci/run installs it with go
// install github.com/prometheus/prometheus/cmd/promtool@v0.316.0). CI fails without it.
func promtoolBinary(t *testing.T) string {
	candidates := []string{}
	if p, err := exec.LookPath("promtool"); err == nil {
		candidates = append(candidates, p)
	}
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		// go install puts tools in GOBIN when it is set, else in GOPATH/bin.
		if gobin, gopath, _ := strings.Cut(string(out), "\n"); strings.TrimSpace(gobin) != "" {
			candidates = append(candidates, filepath.Join(strings.TrimSpace(gobin), "promtool"))
		} else {
			candidates = append(candidates, filepath.Join(strings.TrimSpace(gopath), "bin", "promtool"))
		}
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	const how = "go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0 (or make promtool)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("promtool not found; .ci/run installs it: %s", how)
	}
	t.Skipf("promtool not found, the rules were NOT checked by it: %s", how)
	return ""
}

// promtool loads the rules (PromQL parsed, templates checked) and runs their unit tests.
func TestAlertRulesWithPromtool(t *testing.T) {
	bin := promtoolBinary(t)
	for _, args := range [][]string{{"check", "rules", "kvgate-alerts.yaml"}, {"test", "rules", "kvgate-alerts.test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("SUCCESS")) {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Each dashboard is valid JSON whose every panel queries Prometheus through the datasource
// variable, so it imports into any Grafana.
func TestDashboardsQueryTheDatasourceVariable(t *testing.T) {
	files, _ := filepath.Glob("grafana/*.json")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID    string `json:"uid"`
			Panels []struct {
				Title, Type string
				Targets     []struct {
					Expr       string `json:"expr"`
					Datasource struct {
						UID string `json:"uid"`
					} `json:"datasource"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var queries int
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", f, p.Title)
			}
			for _, q := range p.Targets {
				queries++
				if q.Datasource.UID != "${datasource}" || !strings.Contains(q.Expr, "kvgate_") {
					t.Errorf("%s: panel %q query %q (datasource %q)", f, p.Title, q.Expr, q.Datasource.UID)
				}
			}
		}
		if d.UID == "" || queries < 15 {
			t.Fatalf("%s: uid %q, %d queries", f, d.UID, queries)
		}
	}
}

// The product binary links neither the Kubernetes API types nor the browser driver that these
// tests use.
func TestProductLinksNoDeployTestDependencies(t *testing.T) {
	root, err := procs.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "./cmd/kvgate")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil || !bytes.Contains(out, []byte("github.com/kvgate/kvgate/gateway")) {
		t.Fatalf("go list: %v %s", err, out)
	}
	for _, bad := range []string{"k8s.io/", "sigs.k8s.io/", "github.com/chromedp/"} {
		if bytes.Contains(out, []byte(bad)) {
			t.Errorf("the product binary links %s*", bad)
		}
	}
}
