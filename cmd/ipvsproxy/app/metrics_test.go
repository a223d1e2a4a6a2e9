package app

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/healthz"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// TestMetricsAreKubeProxys compares what /metrics serves with kube-proxy
// v1.37.2's registry in IPVS mode (testdata/kubeproxy/metrics.txt, dumped
// by testdata/kubeproxy/gen.go): every kubeproxy_*, rest_client_* and
// kubernetes_build_info family kube-proxy has, ipvsproxy has with the
// same type, label names and histogram buckets, so dashboards, recording
// rules and alerts written for kube-proxy read ipvsproxy's the same way.
// (kube-proxy's registry also holds apiserver_* and other families its
// imports of k8s.io/apiserver register; those are not the proxy's.)
func TestMetricsAreKubeProxys(t *testing.T) {
	f, err := os.Open("testdata/kubeproxy/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	golden, err := p.TextToMetricFamilies(f)
	if err != nil {
		t.Fatal(err)
	}
	ours := servedFamilies(t)
	compared := 0
	for name, kp := range golden {
		if !strings.HasPrefix(name, "kubeproxy_") && !strings.HasPrefix(name, "rest_client_") && name != "kubernetes_build_info" {
			continue
		}
		compared++
		mf, ok := ours[name]
		if !ok {
			t.Errorf("%s: kube-proxy has it, ipvsproxy does not", name)
			continue
		}
		if got, want := shape(mf), shape(kp); got != want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	if compared < 25 {
		t.Errorf("compared only %d families; is metrics.txt complete?", compared)
	}
}

// shape is a family's type, label names and histogram bounds.
func shape(mf *dto.MetricFamily) string {
	m := mf.GetMetric()[0]
	var labels []string
	for _, l := range m.GetLabel() {
		labels = append(labels, l.GetName())
	}
	slices.Sort(labels)
	s := fmt.Sprintf("%s %v", mf.GetType(), labels)
	if h := m.GetHistogram(); h != nil {
		var b []float64
		for _, bk := range h.GetBucket() {
			if u := bk.GetUpperBound(); !math.IsInf(u, 1) { // the text form lists +Inf, a gathered one does not
				b = append(b, u)
			}
		}
		s += fmt.Sprintf(" buckets %v", b)
	}
	return s
}

type idleSource struct{}

func (idleSource) Pending() (time.Time, time.Time) { return time.Time{}, time.Time{} }
func (idleSource) Ready() bool                     { return false }

// recorder keeps what is registered, so that every vector can be given
// a series (a vector without one is not gathered).
type recorder struct {
	prometheus.Registerer
	cs []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.cs = append(r.cs, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// servedFamilies registers the metrics as Run does, gives each vector one
// series, makes one API request through the proxy's client, and returns
// what /metrics would serve.
func servedFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &recorder{Registerer: reg}
	sync.NewMetrics(rec)
	healthz.New(idleSource{}, time.Minute, rec).Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/healthz", nil))
	for _, c := range rec.cs {
		touch(c)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","items":[]}`)
	}))
	defer srv.Close()
	o := NewOptions()
	o.Master, o.APIContentType = srv.URL, contentTypeJSON
	client, err := newClient(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	mfs, err := MetricsGatherer(reg).Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// touch gives a vector one series, its labels valued as kube-proxy's are.
func touch(c prometheus.Collector) {
	ch := make(chan *prometheus.Desc, 8)
	c.Describe(ch)
	close(ch)
	d := <-ch
	_, l, _ := strings.Cut(d.String(), "variableLabels: {")
	l, _, _ = strings.Cut(l, "}")
	var values []string
	if l != "" {
		for _, n := range strings.Split(l, ",") {
			v := "x"
			if n == "ip_family" {
				v = sync.FamilyIPv4
			}
			values = append(values, v)
		}
	}
	switch v := c.(type) {
	case *prometheus.HistogramVec:
		v.WithLabelValues(values...).Observe(1)
	case *prometheus.GaugeVec:
		v.WithLabelValues(values...).Set(1)
	case *prometheus.CounterVec:
		v.WithLabelValues(values...).Inc()
	}
}
