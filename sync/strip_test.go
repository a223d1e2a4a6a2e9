package sync

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
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
	got, err := strip(sl)
	if err != nil {
		t.Fatal(err)
	}
	if s.ManagedFields != nil || s.Labels != nil || len(s.Annotations) != 2 || s.Status.Conditions != nil || s.Spec.Selector != nil {
		t.Errorf("service kept what the proxy never reads: %+v", s.ObjectMeta)
	}
	if s.Name != "web" || s.Namespace != "default" || s.UID != "u-1" || s.ResourceVersion != "42" ||
		s.Annotations[AnnotationScheduler] != "sh" || s.Annotations[AnnotationWeights] != "zone=zone-a:2" || s.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("service lost what Events or the builder need: %+v %+v", s.ObjectMeta, s.Spec)
	}
	ps, ok := got.(*ProxySlice)
	if !ok {
		t.Fatalf("the transform made a %T of an EndpointSlice, want a *ProxySlice", got)
	}
	if ps.key() != "default/web" || ps.Name != "web-abc" || ps.AddressType != discovery.AddressTypeIPv4 ||
		len(ps.Ports) != 1 || *ps.Ports[0].Port != 8080 || len(ps.Endpoints) != 2 {
		t.Fatalf("slice after strip: %+v", ps)
	}
	e := ps.Endpoints[0]
	if e.Addr != netip.MustParseAddr("10.244.1.5") || *e.NodeName != "n1" || *e.Zone != "zone-a" || !e.Ready || !e.Serving || e.Terminating {
		t.Errorf("slice endpoint after strip: %+v", e)
	}
	if remote := ps.Endpoints[1]; remote.NodeName == nil || *remote.NodeName != "n2" || remote.Addr != netip.MustParseAddr("10.244.2.5") {
		t.Errorf("an endpoint on another node lost its node name (ipvsproxy.io/weights reads it): %+v", remote)
	}
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(ps); err != nil || key != "default/web-abc" {
		t.Errorf("the informer's store keys the slice %q (%v), want default/web-abc", key, err)
	}
}

// TestStripForProxyIsIdempotent: client-go may run the transform again on
// what it stored (a relist, a replace); the result is unchanged.
func TestStripForProxyIsIdempotent(t *testing.T) {
	strip := StripForProxy("n1", CriticalServices{})
	s := svc("default", "web", "10.96.0.10", "80")
	s.Labels = map[string]string{"app": "web"}
	sl := slice("default", "web", "web-abc", "", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.5", node: "n1"})
	for _, obj := range []any{s, sl} {
		once, err := strip(obj)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%+v", once)
		twice, err := strip(once)
		if err != nil {
			t.Fatal(err)
		}
		if twice != once || fmt.Sprintf("%+v", twice) != want {
			t.Errorf("a second transform changed %T:\n%+v\nwant\n%s", once, twice, want)
		}
	}
}

// TestProxySliceEndpoints: the conditions with the API's defaults, and the
// address as Build wants it (unmapped; the zero Addr for what it skips).
func TestProxySliceEndpoints(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	for _, c := range []struct {
		name                  string
		in                    discovery.Endpoint
		addr                  string // "" for the zero Addr
		ready, serving, termi bool
	}{
		{"no conditions", discovery.Endpoint{Addresses: []string{"10.0.0.1"}}, "10.0.0.1", true, true, false},
		{"not ready, serving unknown", discovery.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discovery.EndpointConditions{Ready: no}}, "10.0.0.1", false, false, false},
		{"terminating and serving", discovery.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discovery.EndpointConditions{Ready: no, Serving: yes, Terminating: yes}}, "10.0.0.1", false, true, true},
		{"ready, not serving", discovery.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discovery.EndpointConditions{Ready: yes, Serving: no}}, "10.0.0.1", true, false, false},
		{"first address counts", discovery.Endpoint{Addresses: []string{"fd00::5", "fd00::6"}}, "fd00::5", true, true, false},
		{"IPv4-mapped IPv6", discovery.Endpoint{Addresses: []string{"::ffff:10.0.0.7"}}, "10.0.0.7", true, true, false},
		{"no address", discovery.Endpoint{}, "", true, true, false},
		{"not an address", discovery.Endpoint{Addresses: []string{"example.com"}}, "", true, true, false},
		{"zoned", discovery.Endpoint{Addresses: []string{"fe80::1%eth0"}}, "", true, true, false},
	} {
		got := NewProxySlice(&discovery.EndpointSlice{Endpoints: []discovery.Endpoint{c.in}}).Endpoints[0]
		var want netip.Addr
		if c.addr != "" {
			want = netip.MustParseAddr(c.addr)
		}
		if got.Addr != want || got.Ready != c.ready || got.Serving != c.serving || got.Terminating != c.termi {
			t.Errorf("%s: got addr %v ready %v serving %v terminating %v, want %v %v %v %v",
				c.name, got.Addr, got.Ready, got.Serving, got.Terminating, want, c.ready, c.serving, c.termi)
		}
	}
}

// TestStripForProxyCompactsSlices: the endpoint array is exactly as long
// as the slice's, equal zones and node names share one value across
// endpoints and slices, and this node's name is the transform's own.
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
	strip := StripForProxy("n1", CriticalServices{})
	ga, _ := strip(mk("web-a"))
	gb, _ := strip(mk("web-b"))
	a, b := ga.(*ProxySlice), gb.(*ProxySlice)
	if cap(a.Endpoints) != len(a.Endpoints) {
		t.Errorf("endpoint array keeps room for %d, holds %d", cap(a.Endpoints), len(a.Endpoints))
	}
	e0, e1, e2, f0 := a.Endpoints[0], a.Endpoints[1], a.Endpoints[2], b.Endpoints[0]
	if *e0.NodeName != "n1" || *e1.NodeName != "n2" || *e2.NodeName != "n1" || *e0.Zone != "zone-a" ||
		!e0.Ready || e2.Ready || e0.Addr != netip.MustParseAddr("10.244.1.5") {
		t.Fatalf("values changed: %+v %+v %+v", e0, e1, e2)
	}
	if e0.NodeName != e2.NodeName || e0.NodeName != f0.NodeName || e1.NodeName != b.Endpoints[1].NodeName || e0.Zone != e1.Zone || e0.Zone != f0.Zone {
		t.Error("equal nodes or zones not shared")
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
	var sls [2]*ProxySlice
	for i := range 2 {
		ss[i] = &v1.Service{}
		raw := &discovery.EndpointSlice{}
		if ss[i].Unmarshal(svcWire) != nil || raw.Unmarshal(sliceWire) != nil {
			t.Fatal("decoding the wire objects")
		}
		want, wantSl := ss[i].DeepCopy(), raw.DeepCopy()
		strip(ss[i])
		got, _ := strip(raw)
		sls[i] = got.(*ProxySlice)
		stripService(want)
		if !equality.Semantic.DeepEqual(ss[i], want) {
			t.Fatalf("sharing changed a value:\n%+v", ss[i])
		}
		wantEps := proxySlices(wantSl)[0]
		if !reflect.DeepEqual(sls[i], wantEps) {
			t.Fatalf("sharing changed a value:\n%+v\nwant\n%+v", sls[i], wantEps)
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

// TestProxySliceDeepCopy: a copy (what client-go makes of a runtime.Object
// it must not share) changes nothing of the original when changed.
func TestProxySliceDeepCopy(t *testing.T) {
	orig := NewProxySlice(&discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
		Ports:      []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](80)}},
		Endpoints: []discovery.Endpoint{{Addresses: []string{"10.0.0.1"},
			Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "a"}}}}},
	})
	want := fmt.Sprintf("%+v %+v %+v", *orig, orig.Ports[0], *orig.Endpoints[0].Hints)
	cp, ok := orig.DeepCopyObject().(*ProxySlice)
	if !ok || !reflect.DeepEqual(cp, orig) {
		t.Fatalf("copy %#v, want equal to %#v", cp, orig)
	}
	if !orig.GetObjectKind().GroupVersionKind().Empty() {
		t.Error("a ProxySlice has a kind")
	}
	cp.Ports[0].Port = ptr.To[int32](81)
	cp.Endpoints[0].Ready = false
	cp.Endpoints[0].Hints.ForZones[0].Name = "b"
	if got := fmt.Sprintf("%+v %+v %+v", *orig, orig.Ports[0], *orig.Endpoints[0].Hints); got != want {
		t.Errorf("changing the copy changed the original:\n%s\nwas\n%s", got, want)
	}
}
