//go:build e2e

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
)

// The generated cluster. Addresses are arithmetic on the service index, so
// the kernel checker maps any virtual or real server back to its service
// without a table of a million entries.
const (
	servicePort  = 80
	targetPort   = 8080
	endpointsPer = 10
	perNamespace = 1000 // services per namespace: the API server lists one namespace at a time
	// Every 50th service is a NodePort, as long as the default range
	// (30000–32767) lasts: 2,000 at N = 100,000.
	nodePortEvery = 50
	nodePortMin   = 30000
	nodePortCount = 2768
	managedBy     = "endpointslice-controller.k8s.io"
)

var (
	// ClusterIP of service i: clusterIPBase + 1 + i, inside 10.96.0.0/12.
	clusterIPBase = addrV(netip.MustParseAddr("10.96.0.0"))
	// Endpoints of the services without pods: 10.128.0.0/12, routed to an
	// address-less dummy link in the guest, 254 per /24 (never .0 or .255,
	// which a connected subnet would make its network or broadcast
	// address, and the kernel refuses a broadcast address as a real server).
	endpointBase = addrV(netip.MustParseAddr("10.128.0.0"))
	// The sampled services' endpoints are pods: 10.244.0.0/16, .1–.254.
	podBase = addrV(netip.MustParseAddr("10.244.0.0"))
)

// maxServices is what the address plan holds: 10 endpoints each in the /12.
const maxServices = (1 << 20) / 256 * 254 / endpointsPer

func addrV(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func vAddr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func clusterIP(i int) uint32 { return clusterIPBase + 1 + uint32(i) }

// spread254 maps 0, 1, 2, … to host .1–.254 of consecutive /24s.
func spread254(base uint32, k int) uint32 {
	return base + uint32(k/254)*256 + uint32(k%254) + 1
}

func unspread254(base, v uint32) (int, bool) {
	off := v - base
	host := off % 256
	if v < base || off >= 1<<20 || host == 0 || host == 255 {
		return 0, false
	}
	return int(off/256)*254 + int(host) - 1, true
}

// nodePort is service i's node port, 0 for a ClusterIP service.
func nodePort(i int) int32 {
	if i%nodePortEvery != nodePortEvery-1 || i/nodePortEvery >= nodePortCount {
		return 0
	}
	return int32(nodePortMin + i/nodePortEvery)
}

// workload is the generated cluster: N services, 10 endpoints each, of
// which the sampled services' endpoints are real pods on this node.
type workload struct {
	n          int
	node       string
	nodeIP     netip.Addr
	sample     []int       // sorted service indices whose endpoints are pods
	sampleSlot map[int]int // service index → position in sample
	nodePorts  int
}

func newWorkload(n, samples int, seed uint64, node string, nodeIP netip.Addr) (*workload, error) {
	if n < 1 || n > maxServices {
		return nil, fmt.Errorf("services: want 1…%d (the address plan's size), not %d", maxServices, n)
	}
	w := &workload{n: n, node: node, nodeIP: nodeIP, sampleSlot: map[int]int{}}
	samples = min(samples, n)
	w.sample = rand.New(rand.NewPCG(seed, 0)).Perm(n)[:samples]
	slices.Sort(w.sample)
	for k, i := range w.sample {
		w.sampleSlot[i] = k
	}
	for i := 0; i < n; i++ {
		if nodePort(i) != 0 {
			w.nodePorts++
		}
	}
	return w, nil
}

func namespace(i int) string   { return fmt.Sprintf("b100k-%03d", i/perNamespace) }
func serviceName(i int) string { return fmt.Sprintf("s%06d", i) }

// namespaces lists the workload's namespaces in the order they are
// listed: the generated ones, then the critical services' (critical.go).
func (w *workload) namespaces() []string {
	var out []string
	for i := 0; i < w.n; i += perNamespace {
		out = append(out, namespace(i))
	}
	return append(out, criticalNamespaces()...)
}

// wantVS and wantReals are what the kernel must hold: every generated
// service's ClusterIP and node port, 10 real servers each, and the
// critical services' virtual servers with their endpoints.
func (w *workload) wantVS() int    { return w.n + w.nodePorts + criticalPorts() }
func (w *workload) wantReals() int { return (w.n+w.nodePorts)*endpointsPer + criticalReals() }

// wantAddrs is the addresses kube-ipvs0 must hold: one per ClusterIP.
func (w *workload) wantAddrs() int { return w.n + len(criticalServices) }

// endpointAddr is the address of endpoint j of service i: a pod for a
// sampled service, else an unroutable-but-valid address.
func (w *workload) endpointAddr(i, j int) uint32 {
	if k, ok := w.sampleSlot[i]; ok {
		return spread254(podBase, k*endpointsPer+j)
	}
	return spread254(endpointBase, i*endpointsPer+j)
}

// serviceOfEndpoint maps a real server's address back to its service.
func (w *workload) serviceOfEndpoint(v uint32) (int, bool) {
	if k, ok := unspread254(endpointBase, v); ok {
		i := k / endpointsPer
		_, sampled := w.sampleSlot[i]
		return i, i < w.n && !sampled
	}
	if k, ok := unspread254(podBase, v); ok && k/endpointsPer < len(w.sample) {
		return w.sample[k/endpointsPer], true
	}
	return 0, false
}

func uid(kind byte, i int) types.UID {
	return types.UID(fmt.Sprintf("0000b100-0000-4000-8%03d-%012d", kind, i))
}

func ptr[T any](v T) *T { return &v }

// service is what kube-apiserver would store for service i: the defaults
// it fills in are set too, so the proxy decodes objects of a real size.
func (w *workload) service(i int, created metav1.Time) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace(i), Name: serviceName(i),
			UID: uid('s', i), CreationTimestamp: created},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: vAddr(clusterIP(i)).String(),
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP,
				Port: servicePort, TargetPort: intstr.FromInt32(targetPort)}},
			SessionAffinity:       corev1.ServiceAffinityNone,
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy:        ptr(corev1.IPFamilyPolicySingleStack),
			InternalTrafficPolicy: ptr(corev1.ServiceInternalTrafficPolicyCluster),
		},
	}
	svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
	if np := nodePort(i); np != 0 {
		svc.Spec.Type = corev1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = np
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	return svc
}

// slice is the EndpointSlice the endpoint-slice controller would write
// for service i: 10 ready endpoints, on other nodes unless they are pods.
func (w *workload) slice(svc *corev1.Service, i int, created metav1.Time) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: svc.Name + "-x7k2p", UID: uid('e', i), CreationTimestamp: created,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: managedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name,
				UID: svc.UID, Controller: ptr(true), BlockOwnerDeletion: ptr(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(targetPort))}},
	}
	_, local := w.sampleSlot[i]
	for j := 0; j < endpointsPer; j++ {
		node := fmt.Sprintf("node-%04d", (i*endpointsPer+j)%5000)
		if local {
			node = w.node
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{vAddr(w.endpointAddr(i, j)).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: fmt.Sprintf("%s-%d", svc.Name, j)},
		})
	}
	return es
}

// nodeObject is the sandbox Node: its InternalIP is the node address the
// proxy puts NodePort virtual servers on.
func (w *workload) nodeObject() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: w.node, UID: uid('n', 0),
			Labels: map[string]string{"kubernetes.io/hostname": w.node}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: w.nodeIP.String()},
			{Type: corev1.NodeHostName, Address: w.node},
		}},
	}
}

// fill creates the Node, the namespaces, and every Service and
// EndpointSlice in the fake clientset, through its typed clients as any
// client would; the critical services last.
func (w *workload) fill(ctx context.Context, cs *fake.Clientset, progress func(done int)) error {
	if _, err := cs.CoreV1().Nodes().Create(ctx, w.nodeObject(), metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, ns := range w.namespaces() {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	created := metav1.NewTime(time.Now().Truncate(time.Second))
	for i := 0; i < w.n; i++ {
		svc := w.service(i, created)
		if _, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", svc.Name, err)
		}
		es := w.slice(svc, i, created)
		if _, err := cs.DiscoveryV1().EndpointSlices(es.Namespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("slice %s: %w", es.Name, err)
		}
		if (i+1)%10000 == 0 {
			cs.ClearActions() // see run: the fake's call log would double the memory
			if progress != nil {
				progress(i + 1)
			}
		}
	}
	return fillCritical(ctx, cs, created)
}

// fillCritical creates the critical services and their slices, after
// everything else (critical.go says why).
func fillCritical(ctx context.Context, cs *fake.Clientset, created metav1.Time) error {
	for i, c := range criticalServices {
		if _, err := cs.CoreV1().Services(c.namespace).Create(ctx, c.service(i, created), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", c.key(), err)
		}
		if _, err := cs.DiscoveryV1().EndpointSlices(c.namespace).Create(ctx, c.slice(i, created), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("slice of %s: %w", c.key(), err)
		}
	}
	return nil
}
