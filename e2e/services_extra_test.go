//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 4, the rest of the service semantics with real traffic: topology
// (zone hints, trafficDistribution and this Node's zone label),
// allocateLoadBalancerNodePorts=false, UDP and SCTP node ports. The
// node-wide flags (strict ARP, IPVS timeouts, exclude CIDRs, a missing
// scheduler module) are in services_flags_test.go.

const zoneLabel = "topology.kubernetes.io/zone"

// keepZone puts this Node's zone label back as it was when the test
// ends, so later tests see the Node unchanged.
func keepZone(t *testing.T) {
	t.Helper()
	was, err := cluster.NodeLabel(ctx(t), zoneLabel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.SetNodeLabel(context.Background(), zoneLabel, was); err != nil {
			t.Errorf("restoring node label %s=%q: %v", zoneLabel, was, err)
		}
	})
}

// setZone sets (or, with "", removes) this Node's zone label.
func setZone(t *testing.T, zone string) {
	t.Helper()
	if err := cluster.SetNodeLabel(ctx(t), zoneLabel, zone); err != nil {
		t.Fatalf("label %s=%q on node %s: %v", zoneLabel, zone, cluster.Node, err)
	}
	t.Logf("node %s: %s=%q", cluster.Node, zoneLabel, zone)
}

// hints builds an endpoint's topology hints; nil zones and nodes mean no
// hints at all.
func hints(zones, nodes []string) *discoveryv1.EndpointHints {
	if zones == nil && nodes == nil {
		return nil
	}
	h := &discoveryv1.EndpointHints{}
	for _, z := range zones {
		h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: z})
	}
	for _, n := range nodes {
		h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: n})
	}
	return h
}

// setHintedEndpoints writes the service's slice with the pods (ready, on
// this node) and hs[i] as the hints of pods[i], as the endpointslice
// controller would; it fails if the API server dropped hints.
func setHintedEndpoints(t *testing.T, ts *testService, pods []*framework.Pod, hs []*discoveryv1.EndpointHints) {
	t.Helper()
	es := framework.EndpointSliceFor(ts.svc, ts.svc.Name+"-e2e", cluster.Node, framework.Ready, pods...)
	for i := range es.Endpoints {
		es.Endpoints[i].Hints = hs[i]
	}
	stored, err := cluster.ApplySlice(ctx(t), es)
	if err != nil {
		t.Fatalf("apply endpointslice: %v", err)
	}
	for i, e := range stored.Endpoints {
		want, got := hs[i], e.Hints
		if (want == nil) != (got == nil) || want != nil && (len(want.ForZones) != len(got.ForZones) || len(want.ForNodes) != len(got.ForNodes)) {
			t.Fatalf("API server stored hints %+v for %s, want %+v", got, e.Addresses, want)
		}
	}
	ts.pods = pods
}

// topologyService is a NodePort Service (so cluster and external traffic
// are both checked) whose spec opt changes, with hinted endpoints.
func topologyService(t *testing.T, ns, name string, pods []*framework.Pod, hs []*discoveryv1.EndpointHints, opt func(*corev1.Service)) *testService {
	t.Helper()
	spec := framework.NodePortService(ns, name, httpPort)
	opt(spec)
	ts := applyService(t, spec, nil)
	setHintedEndpoints(t, ts, pods, hs)
	return ts
}

// waitTopology waits until the ClusterIP and node-port virtual servers of
// each service send exactly to want.
func waitTopology(t *testing.T, want []*framework.Pod, services ...*testService) {
	t.Helper()
	node := nodeIP(t)
	for _, ts := range services {
		waitReals(t, vs(corev1.ProtocolTCP, ts.VIP, 80), reals(want, 8080))
		waitReals(t, vs(corev1.ProtocolTCP, node, int(ts.svc.Spec.Ports[0].NodePort)), reals(want, 8080))
	}
}

// Zone hints with PreferClose, PreferSameZone and the topology-mode Auto
// annotation: the node's zone label picks the endpoints hinted for it
// (ClusterIP and node port alike); relabelling the live Node moves the
// traffic; no label, a zone no endpoint is hinted for, or a ready
// endpoint without hints means all endpoints. A Service that asks for
// none of this ignores the hints.
func TestTopologyZoneHints(t *testing.T) {
	proxy(t)
	keepZone(t)
	setZone(t, "zone-a")
	pods := startPods(t, "zone", 3, []int{8080}, nil)
	zoneA, zoneB := pods[:2], pods[2:]
	hs := []*discoveryv1.EndpointHints{hints([]string{"zone-a"}, nil), hints([]string{"zone-a"}, nil), hints([]string{"zone-b"}, nil)}
	ns := namespace(t)
	dist := func(d string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.TrafficDistribution = &d }
	}
	closest := topologyService(t, ns, "close", pods, hs, dist(corev1.ServiceTrafficDistributionPreferClose))
	sameZone := topologyService(t, ns, "same-zone", pods, hs, dist(corev1.ServiceTrafficDistributionPreferSameZone))
	auto := topologyService(t, ns, "auto", pods, hs, func(s *corev1.Service) {
		s.Annotations = map[string]string{"service.kubernetes.io/topology-mode": "Auto"}
	})
	plain := topologyService(t, ns, "plain", pods, hs, func(*corev1.Service) {})
	aware := []*testService{closest, sameZone, auto}
	node := nodeIP(t)
	answers := func(want []*framework.Pod) {
		t.Helper()
		expectAllAnswer(t, framework.GetTCP, closest.VIP, 80, 12, want)
		expectAllAnswer(t, framework.GetTCP, node, int(sameZone.svc.Spec.Ports[0].NodePort), 12, want)
	}

	waitTopology(t, zoneA, aware...)
	waitTopology(t, pods, plain)
	answers(zoneA)

	// Each step changes what the services want, so every wait proves
	// the proxy followed the Node.
	setZone(t, "zone-b")
	waitTopology(t, zoneB, aware...)
	answers(zoneB)
	setZone(t, "")
	waitTopology(t, pods, aware...)
	answers(pods)
	setZone(t, "zone-a")
	waitTopology(t, zoneA, aware...)
	setZone(t, "zone-c")
	waitTopology(t, pods, aware...)
	answers(pods)
	waitTopology(t, pods, plain)

	// Partial hints: one ready endpoint without any means all endpoints.
	setZone(t, "zone-a")
	waitTopology(t, zoneA, closest)
	setHintedEndpoints(t, closest, pods, []*discoveryv1.EndpointHints{hs[0], hs[1], nil})
	waitTopology(t, pods, closest)
	expectAllAnswer(t, framework.GetTCP, closest.VIP, 80, 12, pods)
}

// trafficDistribution PreferSameNode: the endpoint hinted for this node
// alone gets the traffic; with none for this node the zone hints decide;
// with neither a zone label nor a node hint, all endpoints do.
func TestTopologyPreferSameNode(t *testing.T) {
	proxy(t)
	keepZone(t)
	setZone(t, "zone-a")
	pods := startPods(t, "samenode", 3, []int{8080}, nil)
	here := []string{cluster.Node}
	hs := []*discoveryv1.EndpointHints{
		hints([]string{"zone-a"}, here),
		hints([]string{"zone-a"}, []string{otherNode}),
		hints([]string{"zone-b"}, []string{otherNode}),
	}
	d := corev1.ServiceTrafficDistributionPreferSameNode
	ts := topologyService(t, namespace(t), "same-node", pods, hs, func(s *corev1.Service) { s.Spec.TrafficDistribution = &d })
	node, np := nodeIP(t), int(ts.svc.Spec.Ports[0].NodePort)

	waitTopology(t, pods[:1], ts)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 6, pods[:1])
	expectAllAnswer(t, framework.GetTCP, node, np, 6, pods[:1])

	hs[0] = hints([]string{"zone-a"}, []string{otherNode})
	setHintedEndpoints(t, ts, pods, hs)
	waitTopology(t, pods[:2], ts)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 12, pods[:2])

	setZone(t, "")
	waitTopology(t, pods, ts)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 12, pods)
}

// allocateLoadBalancerNodePorts=false: the API server allocates no node
// port, the LB IP answers, and no virtual server other than the
// ClusterIP's and the LB IP's sends to the service's pods (so none on a
// node address).
func TestLoadBalancerWithoutNodePorts(t *testing.T) {
	proxy(t)
	const lbIP = "203.0.113.50"
	pods := startPods(t, "lbnonp", 2, []int{8080}, nil)
	ns := namespace(t)
	spec := framework.LoadBalancerService(ns, "lbnonp", httpPort)
	no := false
	spec.Spec.AllocateLoadBalancerNodePorts = &no
	ts := applyService(t, spec, pods)
	if np := ts.svc.Spec.Ports[0].NodePort; np != 0 {
		t.Fatalf("API server allocated node port %d despite allocateLoadBalancerNodePorts=false", np)
	}
	if _, err := cluster.SetLoadBalancerIngress(ctx(t), ns, "lbnonp", lbIP); err != nil {
		t.Fatal(err)
	}
	waitReals(t, vs(corev1.ProtocolTCP, lbIP, 80), reals(pods, 8080))
	waitReals(t, vs(corev1.ProtocolTCP, ts.VIP, 80), reals(pods, 8080))
	c := startClient(t, "lbnonp", "10.20.8.2")
	expectAllAnswer(t, c.GetTCP, lbIP, 80, 10, pods)
	expectAllAnswer(t, framework.GetTCP, lbIP, 80, 10, pods)

	vss, err := framework.IPVS()
	if err != nil {
		t.Fatal(err)
	}
	podReals := map[string]bool{}
	for _, r := range reals(pods, 8080) {
		podReals[r] = true
	}
	allowed := map[string]bool{vs(corev1.ProtocolTCP, lbIP, 80): true, vs(corev1.ProtocolTCP, ts.VIP, 80): true}
	for key, v := range vss {
		for addr := range v.Reals {
			if podReals[addr] && !allowed[key] {
				t.Errorf("virtual server %s sends to %s: a service without node ports has only its ClusterIP and LB IP\n%s", key, addr, framework.DumpKernel())
			}
		}
	}
}

// A UDP NodePort Service answers datagrams sent to the node's address.
func TestNodePortUDP(t *testing.T) {
	proxy(t)
	pods := startPods(t, "npudp", 2, nil, []int{5353})
	waitUDPBackends(t, pods, 5353)
	ts := applyService(t, framework.NodePortService(namespace(t), "npudp", dnsPort), pods)
	np := int(ts.svc.Spec.Ports[0].NodePort)
	if np == 0 {
		t.Fatalf("API server allocated no node port: %+v", ts.svc.Spec.Ports)
	}
	node := nodeIP(t)
	waitReals(t, vs(corev1.ProtocolUDP, node, np), reals(pods, 5353))
	waitSetEntries(t, "KUBE-NODE-PORT-UDP", strconv.Itoa(np))
	expectAllAnswer(t, framework.AskUDP, node, np, 10, pods)
}

// waitUDPBackends waits until every pod answers on its UDP port directly:
// StartPod only polls TCP ports, and a datagram that arrives before a
// UDP-only backend has bound its socket is refused (ICMP port unreachable).
func waitUDPBackends(t *testing.T, pods []*framework.Pod, port int) {
	t.Helper()
	for _, p := range pods {
		err := framework.Eventually(framework.PodStartTimeout, 100*time.Millisecond, func() error {
			name, err := framework.AskUDP(p.IP, port)
			if err == nil && name != p.Name {
				err = fmt.Errorf("%s:%d answered as %q, want %s", p.IP, port, name, p.Name)
			}
			return err
		})
		if err != nil {
			t.Fatalf("pod %s on UDP %d: %v", p.Name, port, err)
		}
	}
}

// An SCTP NodePort Service: VS on nodeIP:nodePort, the
// KUBE-NODE-PORT-SCTP-HASH entry (hash:ip,port: per node address), and
// real SCTP associations through the node port and the ClusterIP, each
// answered by a pod (`e2ectl sctp` in the pod, a raw-socket client here).
func TestNodePortSCTP(t *testing.T) {
	proxy(t)
	if _, err := framework.Run("modprobe", "sctp"); err != nil {
		t.Fatalf("the sandbox kernel's sctp module: %v", err)
	}
	const port = 9999
	pods := startPods(t, "npsctp", 2, nil, nil)
	for _, p := range pods {
		srv, err := p.ServeSCTP(port, results)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
	}
	sctpPort := framework.Port{Name: "sctp", Protocol: corev1.ProtocolSCTP, Port: port, TargetPort: port}
	ts := applyService(t, framework.NodePortService(namespace(t), "npsctp", sctpPort), pods)
	np := int(ts.svc.Spec.Ports[0].NodePort)
	if np == 0 {
		t.Fatalf("API server allocated no node port: %+v", ts.svc.Spec.Ports)
	}
	node := nodeIP(t)
	waitReals(t, vs(corev1.ProtocolSCTP, node, np), reals(pods, port))
	waitReals(t, vs(corev1.ProtocolSCTP, ts.VIP, port), reals(pods, port))
	waitSetEntries(t, "KUBE-NODE-PORT-SCTP-HASH", node+",sctp:"+strconv.Itoa(np))
	// From the node's own address, so the association has one path.
	ask := func(ip string, port int) (string, error) { return framework.AskSCTP(node, ip, port) }
	expectAllAnswer(t, ask, node, np, 10, pods)
	expectAllAnswer(t, ask, ts.VIP, port, 10, pods)
}
