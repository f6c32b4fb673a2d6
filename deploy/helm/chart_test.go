// Package helm_test checks the Helm chart in deploy/helm/kvgate: helm lint, helm template, and
// every rendered object decoded strictly into the Kubernetes API types (an unknown or misspelt
// field fails). It is a test-only package: the product binary never links k8s.io.
package helm_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/config"
)

// helmVersion is the helm the checks are written against (.ci/run installs it). Built with go
// install, helm reports only "v4.3" (its release ldflags are not set), so any v4 is taken.
const (
	helmVersion      = "v4.3.2"
	helmVersionShort = "v4."
)

// helmBinary is helm from HELM_BIN, PATH or $(go env GOPATH)/bin. In CI (CI=true) a missing
// helm fails the test: .ci/run installs it; a developer without it is told how to get it.
func helmBinary(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("HELM_BIN")}
	if p, err := exec.LookPath("helm"); err == nil {
		candidates = append(candidates, p)
	}
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		// go install puts tools in GOBIN when it is set, else in GOPATH/bin.
		if gobin, gopath, _ := strings.Cut(string(out), "\n"); strings.TrimSpace(gobin) != "" {
			candidates = append(candidates, filepath.Join(strings.TrimSpace(gobin), "helm"))
		} else {
			candidates = append(candidates, filepath.Join(strings.TrimSpace(gopath), "bin", "helm"))
		}
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if out, err := exec.Command(c, "version", "--short").Output(); err == nil && strings.HasPrefix(string(out), helmVersionShort) {
			return c
		}
	}
	const how = "go install helm.sh/helm/v4/cmd/helm@" + helmVersion + " (or make helm)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("helm %s not found (HELM_BIN, PATH, GOPATH/bin); .ci/run installs it: %s", helmVersion, how)
	}
	t.Skipf("helm %s not found, the chart was NOT checked: %s", helmVersion, how)
	return ""
}

func helm(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// ServiceMonitor is the Prometheus Operator's CRD, which k8s.io/api does not have: the fields the
// chart uses, decoded just as strictly (a field not declared here fails the test).
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			Authorization *struct {
				Type        string                    `json:"type"`
				Credentials *corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered holds the objects of one helm template, by kind.
type rendered struct {
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	deployments     []*appsv1.Deployment
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors []*ServiceMonitor
}

// decodeStrict decodes one YAML document into v, failing on unknown and duplicate fields.
func decodeStrict(doc []byte, v any) error {
	return yaml.UnmarshalStrict(doc, v)
}

// decodeAll splits helm's output into documents and decodes each by its apiVersion and kind.
func decodeAll(t *testing.T, out []byte) *rendered {
	t.Helper()
	r := &rendered{}
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document does not parse: %v\n%s", err, doc)
		}
		if tm.Kind == "" {
			if len(bytes.TrimSpace(stripComments(doc))) > 0 {
				t.Fatalf("a rendered document without a kind:\n%s", doc)
			}
			continue
		}
		var err error
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ConfigMap":
			err = decodeInto(doc, &r.configMaps)
		case "v1 Secret":
			err = decodeInto(doc, &r.secrets)
		case "v1 Service":
			err = decodeInto(doc, &r.services)
		case "v1 ServiceAccount":
			err = decodeInto(doc, &r.serviceAccounts)
		case "apps/v1 Deployment":
			err = decodeInto(doc, &r.deployments)
		case "policy/v1 PodDisruptionBudget":
			err = decodeInto(doc, &r.pdbs)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			err = decodeInto(doc, &r.hpas)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			err = decodeInto(doc, &r.serviceMonitors)
		default:
			t.Fatalf("the chart renders %s %s, which this test does not know: add it", tm.APIVersion, tm.Kind)
		}
		if err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", tm.Kind, err, doc)
		}
	}
	return r
}

func decodeInto[T any](doc []byte, list *[]*T) error {
	v := new(T)
	if err := decodeStrict(doc, v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// The decoder is strict: a misspelt field in a Deployment fails (otherwise the test below would
// pass charts whose probes Kubernetes silently drops).
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	doc := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: x\n          livenessProbes: {}\n")
	var d appsv1.Deployment
	if err := decodeStrict(doc, &d); err == nil || !strings.Contains(err.Error(), "livenessProbes") {
		t.Fatalf("want an error naming livenessProbes, got %v", err)
	}
	var sm ServiceMonitor
	if err := decodeStrict([]byte("apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec: {endpoints: [{prot: http}]}\n"), &sm); err == nil {
		t.Fatal("a misspelt ServiceMonitor field decoded")
	}
}

func chartDir(t *testing.T) string {
	dir, err := filepath.Abs("kvgate")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestHelmLint(t *testing.T) {
	bin := helmBinary(t)
	out := helm(t, bin, "lint", "--strict", chartDir(t))
	if !bytes.Contains(out, []byte("1 chart(s) linted, 0 chart(s) failed")) {
		t.Fatalf("helm lint:\n%s", out)
	}
	helm(t, bin, "lint", "--strict", chartDir(t), "-f", "testdata/full-values.yaml")
}

// The defaults render the core objects (no HPA, no ServiceMonitor: those need opting in).
func TestChartDefaultsRender(t *testing.T) {
	r := decodeAll(t, helm(t, helmBinary(t), "template", "kvgate", chartDir(t)))
	if len(r.deployments) != 1 || len(r.services) != 1 || len(r.configMaps) != 1 || len(r.pdbs) != 1 || len(r.secrets) != 1 ||
		len(r.hpas) != 0 || len(r.serviceMonitors) != 0 {
		t.Fatalf("default render: %d deployments, %d services, %d configmaps, %d pdbs, %d secrets, %d hpas, %d servicemonitors",
			len(r.deployments), len(r.services), len(r.configMaps), len(r.pdbs), len(r.secrets), len(r.hpas), len(r.serviceMonitors))
	}
	if r.deployments[0].Spec.Replicas == nil || *r.deployments[0].Spec.Replicas != 2 {
		t.Fatal("without autoscaling the Deployment sets replicas")
	}
}

// Everything on: each object decodes strictly, and the parts fit together as a cluster would
// need them to.
func TestChartRendersAProductionInstall(t *testing.T) {
	r := decodeAll(t, helm(t, helmBinary(t), "template", "prod", chartDir(t), "-f", "testdata/full-values.yaml"))
	if len(r.deployments) != 1 || len(r.services) != 1 || len(r.configMaps) != 1 || len(r.secrets) != 1 ||
		len(r.pdbs) != 1 || len(r.hpas) != 1 || len(r.serviceMonitors) != 1 || len(r.serviceAccounts) != 1 {
		t.Fatalf("objects rendered: %+v", r)
	}
	dep, svc, cm, sec := r.deployments[0], r.services[0], r.configMaps[0], r.secrets[0]
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The config the pod reads is the ConfigMap's, and it passes kvgate's own validation with
	// the Secret's values as the environment the pod gets.
	env := []string{}
	for _, e := range c.Env {
		if e.Name == "KVGATE_LISTEN" {
			env = append(env, e.Name+"="+e.Value) // a plain value: the listen address is no secret
			continue
		}
		ref := e.ValueFrom
		if ref == nil || ref.SecretKeyRef == nil {
			t.Fatalf("env %s does not come from a Secret: %+v", e.Name, e)
		}
		if ref.SecretKeyRef.Name == "engine-keys" { // the values' backendAPIKeys: a Secret of the user's
			if e.Name != "KVGATE_BACKENDS_PREFILL_0_API_KEY" || ref.SecretKeyRef.Key != "prefill-0" {
				t.Fatalf("backend key env %+v", e)
			}
			env = append(env, e.Name+"=an-engine-key")
			continue
		}
		if ref.SecretKeyRef.Name != sec.Name {
			t.Fatalf("env %s does not come from the chart's Secret: %+v", e.Name, e)
		}
		if v, ok := sec.StringData[ref.SecretKeyRef.Key]; ok {
			env = append(env, e.Name+"="+v)
		}
	}
	if len(env) != 7 {
		t.Fatalf("want the listen address, canary secret, admin key hash, Redis URL, tenants, scrape key hash and a backend key, got %v", env)
	}
	for _, secret := range sec.StringData {
		if strings.Contains(cm.Data["kvgate.yaml"], secret) {
			t.Fatal("a secret value is in the ConfigMap")
		}
	}
	cfg, err := config.Parse([]byte(cm.Data["kvgate.yaml"]), env)
	if err != nil {
		t.Fatalf("the rendered kvgate.yaml does not load:\n%v\n%s", err, cm.Data["kvgate.yaml"])
	}
	if cfg.Listen != "0.0.0.0:8080" || !cfg.Canary.Enabled || cfg.Canary.Secret == "" || cfg.State.RedisURL == "" || cfg.AdminKeySHA256 == "" {
		t.Fatalf("config as loaded: listen %s, canary %v, redis %q", cfg.Listen, cfg.Canary.Enabled, cfg.State.RedisURL)
	}
	if len(cfg.Tenants) != 1 || cfg.Tenants[0].Name != "acme" || cfg.Tenants[0].RPM != 600 || cfg.Backends[0].APIKey != "an-engine-key" {
		t.Fatalf("tenants and backend keys from the Secrets: %+v, backend %s key set %v", cfg.Tenants, cfg.Backends[0].Name, cfg.Backends[0].APIKey != "")
	}
	var mounted bool
	for _, v := range pod.Volumes {
		if v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			mounted = true
		}
	}
	if !mounted || len(c.Args) != 3 || c.Args[2] != "/etc/kvgate/kvgate.yaml" {
		t.Fatalf("the ConfigMap is not what the container reads: args %v, volumes %+v", c.Args, pod.Volumes)
	}

	// Probes, and a grace period that outlasts the preStop sleep and the whole drain.
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Fatalf("probes: %+v %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("no preStop sleep: %+v", c.Lifecycle)
	}
	preStop := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	if need := preStop + cfg.Server.DrainDelay + cfg.Server.DrainTimeout; grace <= need {
		t.Fatalf("grace %s is not above preStop %s + drain_delay %s + drain_timeout %s", grace, preStop, cfg.Server.DrainDelay, cfg.Server.DrainTimeout)
	}

	// Non-root, read-only root filesystem, nothing extra, resources set.
	psc, csc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
		csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || csc.Capabilities == nil || len(csc.Capabilities.Drop) != 1 {
		t.Fatalf("security contexts: pod %+v container %+v", psc, csc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Fatalf("resources: %+v", c.Resources)
	}

	// The Service, PDB and ServiceMonitor select the pods; the HPA scales the Deployment.
	labels := dep.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		if len(sel) == 0 {
			return false
		}
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	if !selects(svc.Spec.Selector) || !selects(dep.Spec.Selector.MatchLabels) || !selects(r.pdbs[0].Spec.Selector.MatchLabels) {
		t.Fatal("a selector does not match the pod's labels")
	}
	if svc.Spec.Ports[0].TargetPort.StrVal != c.Ports[0].Name {
		t.Fatalf("service targets %v, container port is %s", svc.Spec.Ports[0].TargetPort, c.Ports[0].Name)
	}
	if h := r.hpas[0]; h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != dep.Name || dep.Spec.Replicas != nil {
		t.Fatalf("HPA target %+v; with autoscaling the Deployment must not pin replicas", h.Spec.ScaleTargetRef)
	}
	sm := r.serviceMonitors[0]
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Fatalf("ServiceMonitor selects %s=%s, the Service has %q", k, v, svc.Labels[k])
		}
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != svc.Spec.Ports[0].Name || ep.Path != "/metrics" || ep.Authorization == nil || ep.Authorization.Type != "Bearer" || ep.Authorization.Credentials == nil {
		t.Fatalf("ServiceMonitor endpoint %+v (/metrics needs a key by default)", ep)
	}
	// Issue 31: the key the ServiceMonitor sends, from the chart's Secret, is one the gateway
	// takes for /metrics: its SHA-256 is the loaded server.metrics_key_sha256.
	cred := ep.Authorization.Credentials
	scrapeKey, ok := sec.StringData[cred.Key]
	if cred.Name != sec.Name || !ok || scrapeKey == "" {
		t.Fatalf("ServiceMonitor credentials %+v, not a key of the chart's Secret %s", cred, sec.Name)
	}
	if cfg.Server.MetricsAuth != config.MetricsAuthKey || cfg.Server.MetricsKeySHA256 != config.SHA256Hex(scrapeKey) {
		t.Fatalf("the gateway does not take the ServiceMonitor's key: metrics_auth %s, metrics_key_sha256 %q", cfg.Server.MetricsAuth, cfg.Server.MetricsKeySHA256)
	}
	if w := cfg.Warnings(); len(w) != 0 {
		t.Fatalf("the production install warns: %v", w)
	}
}

// An existing Secret for the whole config (backend API keys, tenant key hashes) replaces the
// ConfigMap as the mounted file.
func TestChartConfigFromExistingSecret(t *testing.T) {
	r := decodeAll(t, helm(t, helmBinary(t), "template", "x", chartDir(t), "--set", "existingConfigSecret=kvgate-config", "--set", "secrets.existingSecret=kvgate-env"))
	if len(r.configMaps) != 0 || len(r.secrets) != 0 {
		t.Fatalf("with existing Secrets the chart makes %d ConfigMaps and %d Secrets", len(r.configMaps), len(r.secrets))
	}
	pod := r.deployments[0].Spec.Template.Spec
	for _, v := range pod.Volumes {
		if v.Name == "config" && (v.Secret == nil || v.Secret.SecretName != "kvgate-config") {
			t.Fatalf("config volume %+v", v)
		}
	}
	for _, e := range pod.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef.Name != "kvgate-env" {
			t.Fatalf("env %s from %s", e.Name, e.ValueFrom.SecretKeyRef.Name)
		}
	}
}

// values.schema.json: a misspelt value fails the render and names itself, instead of being
// ignored (a drain timeout typo would otherwise shorten the grace period silently).
func TestChartValuesSchemaRefusesTypos(t *testing.T) {
	bin := helmBinary(t)
	for set, want := range map[string]string{
		"drain.timeoutSecond=90":          "timeoutSecond",
		"serviceMonitor.enable=true":      "enable",
		"secrets.values.adminKeySHA256=x": "adminKeySHA256",
		"backendAPIKeys[0].backend=x":     "secretName",
		"config.listen=127.0.0.1:9":       "listen",
	} {
		out, err := exec.Command(bin, "template", "x", chartDir(t), "--set", set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("--set %s: want a schema error naming %s, got %v\n%s", set, want, err, out)
		}
	}
}

// A changed Secret rolls the pods (issue 51): kvgate reads its secrets at start only, so the pod
// template carries the chart-made Secret's checksum, which moves with any secret value and with
// nothing else.
func TestChartSecretChangeRollsPods(t *testing.T) {
	bin := helmBinary(t)
	annotations := func(set ...string) map[string]string {
		args := []string{"template", "kvgate", chartDir(t)}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		r := decodeAll(t, helm(t, bin, args...))
		if len(r.deployments) != 1 {
			t.Fatalf("%d deployments", len(r.deployments))
		}
		return r.deployments[0].Spec.Template.Annotations
	}
	a := annotations("secrets.values.canarySecret=first-canary-secret-of-32-chars!")
	again := annotations("secrets.values.canarySecret=first-canary-secret-of-32-chars!")
	b := annotations("secrets.values.canarySecret=other-canary-secret-of-32-chars!")
	if a["checksum/secret"] == "" || a["checksum/config"] == "" {
		t.Fatalf("pod template annotations %v: want checksum/config and checksum/secret", a)
	}
	if a["checksum/secret"] != again["checksum/secret"] {
		t.Fatalf("the same values gave two secret checksums: %q, %q", a["checksum/secret"], again["checksum/secret"])
	}
	if a["checksum/secret"] == b["checksum/secret"] {
		t.Fatalf("a changed canary secret left checksum/secret at %q: the pods would keep the old secret", a["checksum/secret"])
	}
	if a["checksum/config"] != b["checksum/config"] {
		t.Fatal("a secret change moved checksum/config: the config does not hold secrets")
	}
}
