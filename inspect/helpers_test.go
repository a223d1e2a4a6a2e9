package inspect

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

var testConfig = sync.Config{NodeName: "node-a", Scheduler: "rr", IPv4: true,
	NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10")}}

// newFakeKernel is a node after ipvsproxy's set-up: the link and the
// IPv4 sets exist and are empty.
func newFakeKernel(t testing.TB) *fakenode.Node { return fakenode.New(t, true, false) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func vsKey(a string, p ipvs.Protocol, port uint16) ipvs.ServiceKey {
	return ipvs.ServiceKey{Address: addr(a), Protocol: p, Port: port}
}

func real(a string, port uint16, w int32) ipvs.RealServer {
	return ipvs.RealServer{RealKey: ipvs.RealKey{Address: addr(a), Port: port}, Weight: w}
}

func service(ns, name, typ, ip string, port, nodePort int32) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceType(typ), ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "http", Port: port, NodePort: nodePort, Protocol: v1.ProtocolTCP}}},
	}
}

func endpoints(ns, svc string, port int32, ips ...string) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc + "-x", Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{ip},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	return s
}
