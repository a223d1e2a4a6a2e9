//go:build e2e

package main

import (
	"fmt"
	"net/netip"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The critical services of issue 20: default/kubernetes and cluster DNS,
// which ipvsproxy programs before the rest at start (docs/architecture.md,
// "Start-up order and readiness"; kube-dns matches the default
// --critical-services by name and by its k8s-app label). The generated
// cluster holds them besides its N services so the benchmark can time them.
//
// Where they come in the lists: their namespaces, "default" and
// "kube-system", sort after every generated "b100k-NNN", and namespaces()
// puts them last. kube-apiserver lists from etcd in key order, so a real
// cluster named like this one delivers them last too; the fake API server
// reads namespace after namespace in that order, and fill creates them
// after the rest. That is the worst case for a proxy that programs in the
// order of delivery: the whole list comes before them.
var criticalServices = []criticalService{
	{namespace: "default", name: "kubernetes",
		labels:    map[string]string{"component": "apiserver", "provider": "kubernetes"},
		clusterIP: netip.MustParseAddr("10.111.255.1"),
		ports:     []critPort{{name: "https", proto: corev1.ProtocolTCP, port: 443, target: 6443}},
		// Three API servers, as an HA control plane has; they are not
		// pods, so no node name.
		endpoints: []netip.Addr{netip.MustParseAddr("10.127.255.1"), netip.MustParseAddr("10.127.255.2"),
			netip.MustParseAddr("10.127.255.3")}},
	{namespace: "kube-system", name: "kube-dns", node: "node-0001",
		labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true",
			"kubernetes.io/name": "CoreDNS"},
		clusterIP: netip.MustParseAddr("10.111.255.10"),
		ports: []critPort{
			{name: "dns", proto: corev1.ProtocolUDP, port: 53, target: 53},
			{name: "dns-tcp", proto: corev1.ProtocolTCP, port: 53, target: 53},
			{name: "metrics", proto: corev1.ProtocolTCP, port: 9153, target: 9153}},
		// CoreDNS's two replicas.
		endpoints: []netip.Addr{netip.MustParseAddr("10.127.255.11"), netip.MustParseAddr("10.127.255.12")}},
}

// criticalNet holds the critical services' endpoints; prepareNode routes
// it as it routes the generated endpoints. The ClusterIPs above are in
// the last /24 of the service range 10.96.0.0/12: the generated ClusterIPs
// start at 10.96.0.1 (the address kube-apiserver gives default/kubernetes)
// and never reach it (TestCriticalAddresses).
const criticalNet = "10.127.255.0/24"

// critPort is one port of a critical service.
type critPort struct {
	name         string
	proto        corev1.Protocol
	port, target int32
}

// criticalService is one critical Service and the addresses of its
// endpoints (on other nodes: none is local).
type criticalService struct {
	namespace, name string
	node            string // the endpoints' node, "" for none
	labels          map[string]string
	clusterIP       netip.Addr
	ports           []critPort
	endpoints       []netip.Addr
}

func (c criticalService) key() string { return c.namespace + "/" + c.name }

// criticalNamespaces are the critical services' namespaces, in list order.
func criticalNamespaces() []string {
	var out []string
	for _, c := range criticalServices {
		if len(out) == 0 || out[len(out)-1] != c.namespace {
			out = append(out, c.namespace)
		}
	}
	return out
}

// service is the Service as kube-apiserver stores it (its defaults set).
// i is its index in criticalServices.
func (c criticalService) service(i int, created metav1.Time) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, Labels: c.labels,
			UID: uid('c', i), CreationTimestamp: created},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			ClusterIP:             c.clusterIP.String(),
			ClusterIPs:            []string{c.clusterIP.String()},
			SessionAffinity:       corev1.ServiceAffinityNone,
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy:        ptr(corev1.IPFamilyPolicySingleStack),
			InternalTrafficPolicy: ptr(corev1.ServiceInternalTrafficPolicyCluster),
		},
	}
	for _, p := range c.ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.name, Protocol: p.proto,
			Port: p.port, TargetPort: intstr.FromInt32(p.target)})
	}
	return svc
}

// slice is its one EndpointSlice: every endpoint ready, every port.
func (c criticalService) slice(i int, created metav1.Time) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: c.name + "-c8r4x",
			UID: uid('d', i), CreationTimestamp: created,
			Labels: map[string]string{discoveryv1.LabelServiceName: c.name, discoveryv1.LabelManagedBy: managedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range c.ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr(p.name), Protocol: ptr(p.proto), Port: ptr(p.target)})
	}
	for j, a := range c.endpoints {
		ep := discoveryv1.Endpoint{Addresses: []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}}
		if c.node != "" {
			ep.NodeName = ptr(c.node)
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: c.namespace, Name: fmt.Sprintf("%s-%d", c.name, j)}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

// critVS is one virtual server a critical service makes, and the real
// servers it must hold.
type critVS struct {
	service string // namespace/name
	proto   uint16 // syscall.IPPROTO_TCP or _UDP
	ip      uint32
	port    int
	target  int
	reals   []uint32
}

func (v critVS) String() string {
	p := "TCP"
	if v.proto == syscall.IPPROTO_UDP {
		p = "UDP"
	}
	return fmt.Sprintf("%s %s:%d", p, vAddr(v.ip), v.port)
}

// criticalVirtualServers lists every critical service's virtual servers,
// one per port, in the order of criticalServices.
func criticalVirtualServers() []critVS {
	var out []critVS
	for _, c := range criticalServices {
		var reals []uint32
		for _, a := range c.endpoints {
			reals = append(reals, addrV(a))
		}
		for _, p := range c.ports {
			proto := uint16(syscall.IPPROTO_TCP)
			if p.proto == corev1.ProtocolUDP {
				proto = syscall.IPPROTO_UDP
			}
			out = append(out, critVS{service: c.key(), proto: proto, ip: addrV(c.clusterIP),
				port: int(p.port), target: int(p.target), reals: reals})
		}
	}
	return out
}

// realServer is one real server as the kernel reports it.
type realServer struct {
	ip     uint32
	port   int
	weight int
}

// complete: the kernel's real servers of v are exactly its endpoints at
// the target port, each with a weight (0 is a draining server, not one
// that takes traffic).
func (v critVS) complete(reals []realServer) bool {
	if len(reals) != len(v.reals) {
		return false
	}
	for _, r := range reals {
		if !v.isReal(r.ip, r.port, r.weight) {
			return false
		}
	}
	return true // as many as wanted, each wanted, and the kernel holds no duplicates
}

func (v critVS) isReal(ip uint32, port, weight int) bool {
	if port != v.target || weight <= 0 {
		return false
	}
	for _, want := range v.reals {
		if ip == want {
			return true
		}
	}
	return false
}

// criticalPorts is how many ClusterIP:port entries the critical services
// add to KUBE-CLUSTER-IP (one per virtual server).
func criticalPorts() int { return len(criticalVirtualServers()) }

// criticalReals is how many real servers they add.
func criticalReals() int {
	n := 0
	for _, v := range criticalVirtualServers() {
		n += len(v.reals)
	}
	return n
}
