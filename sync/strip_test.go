package sync

import (
	"fmt"
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestStripForProxyKeepsWhatTheProxyReads: what is dropped is gone, and
// what Events and the tracker need is still there (Build equivalence is
// checked over the fuzz corpus by FuzzBuild).
func TestStripForProxyKeepsWhatTheProxyReads(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}}
	s := svc("default", "web", "10.96.0.10", "80")
	s.UID, s.ResourceVersion = "u-1", "42"
	s.ManagedFields = managed
	s.Labels = map[string]string{"app.kubernetes.io/name": "web", "helm.sh/chart": "web-1.2.3"}
	s.Annotations = map[string]string{AnnotationScheduler: "sh", AnnotationWeights: "zone=zone-a:2", "kubectl.kubernetes.io/last-applied-configuration": `{"big":"json"}`}
	s.Status.Conditions = []metav1.Condition{{Type: "Ready"}}
	s.Spec.Selector = map[string]string{"app": "web"}
	sl := slice("default", "web", "web-abc", "", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: "n1"}, ep{ip: "10.244.2.5", node: "n2"})
	sl.Labels["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
	sl.ManagedFields = managed
	sl.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-01T10:00:00Z"}
	sl.OwnerReferences = []metav1.OwnerReference{{Kind: "Service", Name: "web"}}
	sl.Endpoints[0].TargetRef = &v1.ObjectReference{Kind: "Pod", Name: "web-7d9f", Namespace: "default"}
	sl.Endpoints[0].Hostname = ptr.To("web-0")
	sl.Endpoints[0].Zone = ptr.To("zone-a")

	strip := StripForProxy("n1", CriticalServices{})
	if _, err := strip(s); err != nil {
		t.Fatal(err)
	}
	if _, err := strip(sl); err != nil {
		t.Fatal(err)
	}
	if s.ManagedFields != nil || s.Labels != nil || len(s.Annotations) != 2 || s.Status.Conditions != nil || s.Spec.Selector != nil {
		t.Errorf("service kept what the proxy never reads: %+v", s.ObjectMeta)
	}
	if s.Name != "web" || s.Namespace != "default" || s.UID != "u-1" || s.ResourceVersion != "42" ||
		s.Annotations[AnnotationScheduler] != "sh" || s.Annotations[AnnotationWeights] != "zone=zone-a:2" || s.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("service lost what Events or the builder need: %+v %+v", s.ObjectMeta, s.Spec)
	}
	if sl.ManagedFields != nil || sl.Annotations != nil || sl.OwnerReferences != nil || len(sl.Labels) != 1 {
		t.Errorf("slice kept what the proxy never reads: %+v", sl.ObjectMeta)
	}
	e := sl.Endpoints[0]
	if sliceKey(sl) != "default/web" || e.TargetRef != nil || e.Hostname != nil ||
		e.Addresses[0] != "10.244.1.5" || *e.NodeName != "n1" || *e.Zone != "zone-a" || !*e.Conditions.Ready {
		t.Errorf("slice endpoint after strip: %+v (service key %q)", e, sliceKey(sl))
	}
	if remote := sl.Endpoints[1]; remote.NodeName == nil || *remote.NodeName != "n2" || remote.Addresses[0] != "10.244.2.5" {
		t.Errorf("an endpoint on another node lost its node name (ipvsproxy.io/weights reads it): %+v", remote)
	}
}

// TestStripForProxyCompactsSlices: the endpoint array is trimmed to its
// length, equal conditions, zones and node names share one value across
// endpoints and slices.
func TestStripForProxyCompactsSlices(t *testing.T) {
	mk := func(name string) *discovery.EndpointSlice {
		sl := slice("default", "web", name, "", 8080, v1.ProtocolTCP,
			ep{ip: "10.244.1.5", node: "n1"}, ep{ip: "10.244.1.6", node: "n2"}, ep{ip: "10.244.1.7", node: "n1", notReady: true})
		sl.Endpoints = append(make([]discovery.Endpoint, 0, 16), sl.Endpoints...) // as the decoder leaves it
		for i := range sl.Endpoints {
			sl.Endpoints[i].Zone = ptr.To("zone-a")
		}
		return sl
	}
	a, b := mk("web-a"), mk("web-b")
	strip := StripForProxy("n1", CriticalServices{})
	strip(a)
	strip(b)
	if cap(a.Endpoints) != len(a.Endpoints) {
		t.Errorf("endpoint array keeps room for %d, holds %d", cap(a.Endpoints), len(a.Endpoints))
	}
	e0, e1, e2, f0 := a.Endpoints[0], a.Endpoints[1], a.Endpoints[2], b.Endpoints[0]
	if *e0.NodeName != "n1" || *e1.NodeName != "n2" || *e2.NodeName != "n1" || *e0.Zone != "zone-a" ||
		!*e0.Conditions.Ready || *e2.Conditions.Ready || e0.Addresses[0] != "10.244.1.5" {
		t.Fatalf("values changed: %+v %+v %+v", e0, e1, e2)
	}
	if e0.NodeName != e2.NodeName || e0.NodeName != f0.NodeName || e1.NodeName != b.Endpoints[1].NodeName || e0.Zone != e1.Zone || e0.Zone != f0.Zone ||
		e0.Conditions.Ready != f0.Conditions.Ready {
		t.Error("equal nodes, zones or conditions not shared")
	}
}

// TestInternTableBounded: a table at its bound starts over instead of
// growing, and still returns equal values.
func TestInternTableBounded(t *testing.T) {
	tab := &internTable[string]{max: 4}
	for i := range 10 {
		name := fmt.Sprintf("node-%d", i)
		if got := tab.intern(&name); *got != name {
			t.Fatalf("intern(%q) = %q", name, *got)
		}
		if len(tab.table) > 4 {
			t.Fatalf("table holds %d entries, bound 4", len(tab.table))
		}
	}
	if tab.intern(nil) != nil {
		t.Error("intern(nil) is not nil")
	}
}

// TestStripKeepsOnlyCriticalLabels: a Service keeps the labels that make
// it critical and nothing else; a Service matching no term keeps none.
func TestStripKeepsOnlyCriticalLabels(t *testing.T) {
	crit, err := ParseCriticalServices([]string{"k8s-app=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	strip := StripForProxy("n1", crit)
	dns := svc("kube-system", "coredns", "10.96.0.10", "53")
	dns.Labels = map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
	other := svc("apps", "web", "10.96.0.11", "80")
	other.Labels = map[string]string{"k8s-app": "web"}
	for _, s := range []*v1.Service{dns, other} {
		if _, err := strip(s); err != nil {
			t.Fatal(err)
		}
	}
	if len(dns.Labels) != 1 || dns.Labels["k8s-app"] != "kube-dns" {
		t.Errorf("critical Service's labels after strip: %v, want only k8s-app=kube-dns", dns.Labels)
	}
	if other.Labels != nil {
		t.Errorf("a Service matching no term kept labels %v", other.Labels)
	}
}

// TestStripSharesRepeatedValues: two Services and two slices decoded
// apart end up pointing at one copy of each value they have in common,
// with the values unchanged.
func TestStripSharesRepeatedValues(t *testing.T) {
	svcWire, sliceWire := wireObjects(t)
	strip := StripForProxy("this-node", CriticalServices{})
	var ss [2]*v1.Service
	var sls [2]*discovery.EndpointSlice
	for i := range 2 {
		ss[i], sls[i] = &v1.Service{}, &discovery.EndpointSlice{}
		if ss[i].Unmarshal(svcWire) != nil || sls[i].Unmarshal(sliceWire) != nil {
			t.Fatal("decoding the wire objects")
		}
		want, wantSl := ss[i].DeepCopy(), sls[i].DeepCopy()
		strip(ss[i])
		strip(sls[i])
		stripService(want)
		stripSlice(wantSl, ptr.To("this-node"))
		if !equality.Semantic.DeepEqual(ss[i], want) || !equality.Semantic.DeepEqual(sls[i], wantSl) {
			t.Fatalf("sharing changed a value:\n%+v\n%+v", ss[i], sls[i])
		}
	}
	a, b := &ss[0].Spec, &ss[1].Spec
	same := func(what string, x, y string) {
		if unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s not shared", what)
		}
	}
	same("namespace", ss[0].Namespace, sls[1].Namespace)
	same("port name", a.Ports[0].Name, b.Ports[0].Name)
	same("protocol", string(a.Ports[0].Protocol), string(b.Ports[0].Protocol))
	same("session affinity", string(a.SessionAffinity), string(b.SessionAffinity))
	same("cluster IP", a.ClusterIP, a.ClusterIPs[0])
	p, q := sls[0].Ports[0], sls[1].Ports[0]
	if &a.IPFamilies[0] != &b.IPFamilies[0] || a.IPFamilyPolicy != b.IPFamilyPolicy ||
		a.InternalTrafficPolicy != b.InternalTrafficPolicy || p.Name != q.Name || p.Port != q.Port || p.Protocol != q.Protocol {
		t.Error("equal pointer fields not shared")
	}
	if cap(a.IPFamilies) != len(a.IPFamilies) {
		t.Error("a shared family list has room to be appended to in place")
	}
}
