package deploy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/app"
	"github.com/ipvsproxy/ipvsproxy/healthz"
	"github.com/ipvsproxy/ipvsproxy/sizing"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

type idle struct{}

func (idle) Pending() (time.Time, time.Time) { return time.Time{}, time.Time{} }
func (idle) Ready() bool                     { return false }

// exported registers the metrics the way run.go does, gives every labelled
// family one series (a vector with no series is not gathered), and returns
// each family's type by the names a query can use.
func exported(t *testing.T) (series map[string]dto.MetricType, families map[string]bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := sync.NewMetrics(reg)
	h := healthz.New(idle{}, time.Minute, reg)
	sizing.NewReporter(reg).Report([]sizing.Finding{{Setting: "net.core.rmem_max"}})
	m.Syncs.WithLabelValues("full").Inc()
	m.KernelOps.WithLabelValues("virtual-server", "add", "ok").Inc()
	m.NoLocalEndpoints.WithLabelValues("internal", sync.FamilyIPv4).Set(0)
	for _, h := range []*prometheus.HistogramVec{m.SyncDuration, m.FullPassDuration, m.NetworkProgramming, m.ConntrackDuration} {
		h.WithLabelValues(sync.FamilyIPv4).Observe(0)
	}
	for _, g := range []*prometheus.GaugeVec{m.LastSync, m.LastQueued} {
		g.WithLabelValues(sync.FamilyIPv4).Set(0)
	}
	for _, c := range []*prometheus.CounterVec{m.RestoreFailures, m.NFTablesSyncFailures, m.ConntrackReconcile} {
		c.WithLabelValues(sync.FamilyIPv4).Add(0)
	}
	for _, path := range []string{"/healthz", "/livez"} {
		h.Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	mfs, err := app.MetricsGatherer(reg).Gather() // what /metrics serves
	if err != nil {
		t.Fatal(err)
	}
	series, families = map[string]dto.MetricType{}, map[string]bool{}
	for _, mf := range mfs {
		n, typ := mf.GetName(), mf.GetType()
		families[n] = true
		series[n] = typ
		switch typ {
		case dto.MetricType_HISTOGRAM:
			delete(series, n) // only the suffixed series exist
			series[n+"_bucket"], series[n+"_sum"], series[n+"_count"] = dto.MetricType_COUNTER, dto.MetricType_COUNTER, dto.MetricType_COUNTER
		case dto.MetricType_SUMMARY:
			series[n+"_sum"], series[n+"_count"] = dto.MetricType_COUNTER, dto.MetricType_COUNTER
		}
	}
	return series, families
}

var (
	// The metric names a query can refer to: ipvsproxy's and kube-proxy's
	// prefixes, the Go and process collectors', and Prometheus' own `up`.
	metricName = regexp.MustCompile(`\b(?:(?:kubeproxy|ipvsproxy|process|go)_[a-zA-Z0-9_]+|up)\b`)
	rateOf     = regexp.MustCompile(`\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
)

// checkExpr fails when expr uses a series the binary does not export, or
// takes the rate of something that is not a counter (a gauge's rate is a
// silent nonsense graph, not an error, in Prometheus).
func checkExpr(t *testing.T, where, expr string, series map[string]dto.MetricType) []string {
	t.Helper()
	var used []string
	for _, name := range metricName.FindAllString(expr, -1) {
		if _, ok := series[name]; !ok && name != "up" {
			t.Errorf("%s: %q is not a metric ipvsproxy exports (in %s)", where, name, expr)
		}
		used = append(used, name)
	}
	for _, m := range rateOf.FindAllStringSubmatch(expr, -1) {
		if typ, ok := series[m[1]]; ok && typ != dto.MetricType_COUNTER {
			t.Errorf("%s: rate of %s, a %s (in %s)", where, m[1], typ, expr)
		}
	}
	if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
		t.Errorf("%s: unbalanced brackets in %s", where, expr)
	}
	return used
}

// strings walks a decoded JSON value and returns every string in it.
func allStrings(v any, out []string) []string {
	switch x := v.(type) {
	case string:
		out = append(out, x)
	case []any:
		for _, e := range x {
			out = allStrings(e, out)
		}
	case map[string]any:
		for _, e := range x {
			out = allStrings(e, out)
		}
	}
	return out
}

// TestDashboardUsesOnlyExportedMetrics checks every query of the Grafana
// dashboard (panels and template variables), and that every ipvsproxy and
// kube-proxy family the binary exports has a panel.
func TestDashboardUsesOnlyExportedMetrics(t *testing.T) {
	series, families := exported(t)
	data, err := os.ReadFile("grafana/ipvsproxy-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	referenced := map[string]bool{}
	for _, s := range allStrings(dash, nil) {
		if metricName.MatchString(s) {
			for _, n := range checkExpr(t, "dashboard", s, series) {
				referenced[strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count")] = true
			}
		}
	}
	for f := range families {
		if (strings.HasPrefix(f, "kubeproxy_") || strings.HasPrefix(f, "ipvsproxy_")) && !referenced[f] {
			t.Errorf("dashboard has no panel for %s", f)
		}
	}
	for _, want := range []string{"process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if !referenced[want] {
			t.Errorf("dashboard does not show %s", want)
		}
	}
}

// promRule is the part of a PrometheusRule the test reads; decoding is
// strict so a misspelt field (e.g. "expresion") fails.
type promRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

func TestAlertsUseOnlyExportedMetrics(t *testing.T) {
	series, _ := exported(t)
	data, err := os.ReadFile("prometheus/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr promRule
	if err := yaml.UnmarshalStrict(data, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("not a PrometheusRule: %s %s", pr.APIVersion, pr.Kind)
	}
	alerts := map[string]string{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			checkExpr(t, r.Alert, r.Expr, series)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: needs a severity label and a summary", r.Alert)
			}
			if _, err := time.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
			alerts[r.Alert] = r.Expr
		}
	}
	// The four alerts, each on the metric that measures it.
	for alert, metric := range map[string]string{
		"IPVSProxySyncStalled":                   "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"IPVSProxyDriftRepairsRising":            "ipvsproxy_kernel_ops_total",
		"IPVSProxySyncErrors":                    "ipvsproxy_sync_failed_services_total",
		"IPVSProxyNetworkProgrammingLatencyHigh": "kubeproxy_network_programming_duration_seconds_bucket",
	} {
		if !strings.Contains(alerts[alert], metric) {
			t.Errorf("alert %s missing or not on %s", alert, metric)
		}
	}
}

// TestPodMonitorScrapesTheMetricsPort ties the PodMonitor to the
// DaemonSet's named port and pod labels.
func TestPodMonitorScrapesTheMetricsPort(t *testing.T) {
	data, err := os.ReadFile("prometheus/podmonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pm struct {
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port string `json:"port"`
			} `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &pm); err != nil {
		t.Fatal(err)
	}
	ds := dsOf(t)
	c := ds.Spec.Template.Spec.Containers[0]
	if len(pm.Spec.Endpoints) != 1 || containerPort(c, pm.Spec.Endpoints[0].Port) == 0 {
		t.Errorf("PodMonitor endpoints %+v do not name a container port", pm.Spec.Endpoints)
	}
	for k, v := range pm.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("PodMonitor selects %s=%s, pods are labelled %v", k, v, ds.Spec.Template.Labels)
		}
	}
}
