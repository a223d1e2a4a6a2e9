//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 4, service semantics with real traffic: node ports, load
// balancers (and their source ranges), external IPs, session affinity.
// Traffic policies, terminating endpoints, IPv6 and schedulers are in
// services_policy_test.go.
//
// Addresses: load-balancer and external IPs come from TEST-NET-3
// (203.0.113.0/24), clients outside the cluster from 10.20.0.0/16; the
// node's own address is the Node's InternalIP (guest/cluster.sh puts it
// on the dummy link node0).

// nodeIP is the sandbox Node's InternalIP, as ipvsproxy sees it.
func nodeIP(t *testing.T) string {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx(t), cluster.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("node %s has no InternalIP: %v", n.Name, n.Status.Addresses)
	return ""
}

// startClient makes a client namespace outside the cluster, removed when
// the test ends.
func startClient(t *testing.T, name, ip string) *framework.Client {
	t.Helper()
	c, err := framework.StartClient(name, ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// vs names a virtual server: "TCP 10.10.0.1:30080".
func vs(proto corev1.Protocol, ip string, port int) string {
	return string(proto) + " " + net.JoinHostPort(ip, strconv.Itoa(port))
}

// reals are the real-server addresses of pods on port (IPv4), sorted.
func reals(pods []*framework.Pod, port int) []string {
	var out []string
	for _, p := range pods {
		out = append(out, net.JoinHostPort(p.IP, strconv.Itoa(port)))
	}
	sort.Strings(out)
	return out
}

// waitReals waits until virtual server key exists with exactly want as
// its active real servers.
func waitReals(t *testing.T, key string, want []string) {
	t.Helper()
	waitRealsWithin(t, programTimeout, key, want)
}

// waitSetEntries waits until every entry is in the ipset.
func waitSetEntries(t *testing.T, set string, entries ...string) {
	t.Helper()
	waitKernel(t, programTimeout, set+" entries", func() error {
		m, err := framework.SetMembers(set)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !m[e] {
				return fmt.Errorf("%s lacks %s (has %v)", set, e, m)
			}
		}
		return nil
	})
}

// A NodePort Service answers on the node's address (nodeIP:nodePort),
// from the node itself and from a client outside the cluster.
func TestNodePort(t *testing.T) {
	proxy(t)
	pods := startPods(t, "np", 2, []int{8080}, nil)
	ts := applyService(t, framework.NodePortService(namespace(t), "np", httpPort), pods)
	np := int(ts.svc.Spec.Ports[0].NodePort)
	if np == 0 {
		t.Fatalf("API server allocated no node port: %+v", ts.svc.Spec.Ports)
	}
	node := nodeIP(t)
	waitReals(t, vs(corev1.ProtocolTCP, node, np), reals(pods, 8080))
	waitSetEntries(t, "KUBE-NODE-PORT-TCP", strconv.Itoa(np))
	expectAllAnswer(t, framework.GetTCP, node, np, 10, pods)
	c := startClient(t, "np", "10.20.1.2")
	expectAllAnswer(t, c.GetTCP, node, np, 10, pods)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)
}

// A LoadBalancer's ingress IP (written through the status subresource)
// answers clients; once loadBalancerSourceRanges is set, a client inside
// the range still gets answers, one outside gets nothing (its packets are
// dropped: the connection times out), and it can still use the node port.
// The node itself is outside the range too, and its own connections to
// the LB IP are dropped as well (kubernetes#119656: IPVS takes them before
// filter INPUT ever sees them); a range holding the node's address lets
// it in again.
func TestLoadBalancerSourceRanges(t *testing.T) {
	proxy(t)
	const lbIP = "203.0.113.10"
	pods := startPods(t, "lb", 2, []int{8080}, nil)
	ns := namespace(t)
	ts := applyService(t, framework.LoadBalancerService(ns, "lb", httpPort), pods)
	if _, err := cluster.SetLoadBalancerIngress(ctx(t), ns, "lb", lbIP); err != nil {
		t.Fatalf("status.loadBalancer.ingress: %v", err)
	}
	key := vs(corev1.ProtocolTCP, lbIP, 80)
	waitReals(t, key, reals(pods, 8080))
	if ok, err := framework.HasAddr("kube-ipvs0", lbIP); err != nil || !ok {
		t.Fatalf("LB IP %s not on kube-ipvs0 (err %v)\n%s", lbIP, err, framework.DumpKernel())
	}
	allowed := startClient(t, "lb-in", "10.20.1.2")
	denied := startClient(t, "lb-out", "10.20.2.2")
	expectAllAnswer(t, allowed.GetTCP, lbIP, 80, 10, pods)
	expectAllAnswer(t, denied.GetTCP, lbIP, 80, 10, pods)
	expectAllAnswer(t, framework.GetTCP, lbIP, 80, 10, pods)

	setRanges := func(ranges ...string) {
		t.Helper()
		if _, err := cluster.UpdateService(ctx(t), ns, "lb", func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = ranges
		}); err != nil {
			t.Fatal(err)
		}
	}
	setRanges("10.20.1.0/24")
	waitSetEntries(t, "KUBE-LOAD-BALANCER-FW", lbIP+",tcp:80")
	waitSetEntries(t, "KUBE-LOAD-BALANCER-SOURCE-CIDR", lbIP+",tcp:80,10.20.1.0/24")
	expectAllAnswer(t, allowed.GetTCP, lbIP, 80, 10, pods)
	expectNoAnswer(t, "client "+denied.IP+" outside loadBalancerSourceRanges", denied.GetTCP, lbIP, 80)
	expectNoAnswer(t, "the node, outside loadBalancerSourceRanges", framework.GetTCP, lbIP, 80)
	np := int(ts.svc.Spec.Ports[0].NodePort)
	expectAllAnswer(t, denied.GetTCP, nodeIP(t), np, 4, pods)

	node := nodeIP(t)
	setRanges("10.20.1.0/24", node+"/32")
	waitSetEntries(t, "KUBE-LOAD-BALANCER-SOURCE-IP", lbIP+",tcp:80,"+lbIP)
	expectAllAnswer(t, framework.GetTCP, lbIP, 80, 10, pods)
	expectAllAnswer(t, allowed.GetTCP, lbIP, 80, 10, pods)
	expectNoAnswer(t, "client "+denied.IP+" outside loadBalancerSourceRanges", denied.GetTCP, lbIP, 80)
}

// expectNoAnswer requires three requests from who to ip:port to fail.
func expectNoAnswer(t *testing.T, who string, ask framework.Ask, ip string, port int) {
	t.Helper()
	for range 3 {
		if name, err := ask(ip, port); err == nil {
			t.Fatalf("%s got an answer from %s through %s:%d\n%s", who, name, ip, port, framework.DumpKernel())
		} else {
			t.Logf("%s refused as expected: %v", who, err)
		}
	}
}

// An external IP answers, from outside and from the node.
func TestExternalIP(t *testing.T) {
	proxy(t)
	const extIP = "203.0.113.20"
	pods := startPods(t, "ext", 2, []int{8080}, nil)
	spec := framework.ClusterIPService(namespace(t), "ext", httpPort)
	spec.Spec.ExternalIPs = []string{extIP}
	applyService(t, spec, pods)
	waitReals(t, vs(corev1.ProtocolTCP, extIP, 80), reals(pods, 8080))
	waitSetEntries(t, "KUBE-EXTERNAL-IP", extIP+",tcp:80")
	c := startClient(t, "ext", "10.20.3.2")
	expectAllAnswer(t, c.GetTCP, extIP, 80, 10, pods)
	expectAllAnswer(t, framework.GetTCP, extIP, 80, 10, pods)
}

// Without affinity round-robin reaches both pods; switching the live
// Service to sessionAffinity ClientIP makes the VS persistent in place
// (its counters keep counting: not deleted and re-created), and then 20
// requests from one client all reach the same pod.
func TestSessionAffinityClientIP(t *testing.T) {
	proxy(t)
	pods := startPods(t, "aff", 2, []int{8080}, nil)
	ns := namespace(t)
	ts := createService(t, ns, "aff", pods, httpPort)
	key := vs(corev1.ProtocolTCP, ts.VIP, 80)
	waitReals(t, key, reals(pods, 8080))
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 20, pods)
	time.Sleep(2500 * time.Millisecond) // the kernel folds per-CPU counters every 2 s
	before := vsConns(t, key)

	if _, err := cluster.UpdateService(ctx(t), ns, "aff", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, programTimeout, "persistent VS (-p 10800)", func() error {
		rule, err := framework.VSRule(key)
		if err == nil && !strings.Contains(rule+" ", " -p 10800 ") {
			err = fmt.Errorf("not persistent: %q", rule)
		}
		return err
	})
	if after := vsConns(t, key); after < before {
		t.Errorf("%s connection counter went from %d to %d: the VS was re-created, not updated in place", key, before, after)
	}
	for _, ask := range []struct {
		who string
		f   framework.Ask
	}{{"node", framework.GetTCP}, {"client 10.20.4.2", startClient(t, "aff", "10.20.4.2").GetTCP}} {
		tally := framework.Repeat(ask.f, ts.VIP, 80, 20)
		t.Logf("from %s: %v", ask.who, tally)
		if len(tally.Errors) > 0 || len(tally.ByPod) != 1 {
			t.Errorf("from %s with ClientIP affinity: want 20 answers from one pod, got %v", ask.who, tally)
		}
	}
}

func vsConns(t *testing.T, key string) uint64 {
	t.Helper()
	stats, err := framework.IPVSStats()
	if err != nil {
		t.Fatal(err)
	}
	return stats[key].Conns
}

// Of two LB ingress IPs the one with ipMode Proxy gets no virtual server
// and no kube-ipvs0 address (the load balancer proxies to the node; it is
// not meant to reach the node with that destination); the VIP-mode one does.
func TestLoadBalancerIPModeProxy(t *testing.T) {
	proxy(t)
	const vipIP, proxyIP = "203.0.113.40", "203.0.113.41"
	pods := startPods(t, "ipmode", 1, []int{8080}, nil)
	ns := namespace(t)
	applyService(t, framework.LoadBalancerService(ns, "ipmode", httpPort), pods)
	svc, err := cluster.Client.CoreV1().Services(ns).Get(ctx(t), "ipmode", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip, prx := corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: vipIP, IPMode: &vip}, {IP: proxyIP, IPMode: &prx}}
	if _, err := cluster.Client.CoreV1().Services(ns).UpdateStatus(ctx(t), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReals(t, vs(corev1.ProtocolTCP, vipIP, 80), reals(pods, 8080))
	expectAllAnswer(t, framework.GetTCP, vipIP, 80, 4, pods)
	vss, err := framework.IPVS()
	if err != nil {
		t.Fatal(err)
	}
	if v := vss[vs(corev1.ProtocolTCP, proxyIP, 80)]; v != nil {
		t.Errorf("ipMode Proxy ingress %s has a virtual server %+v\n%s", proxyIP, v, framework.DumpKernel())
	}
	if ok, err := framework.HasAddr("kube-ipvs0", proxyIP); err != nil || ok {
		t.Errorf("ipMode Proxy ingress %s on kube-ipvs0: %v (err %v)", proxyIP, ok, err)
	}
}

// KUBE-IPVS-FILTER: a host process listening on every address must not
// answer on a service address: a new connection to a ClusterIP port that
// is no service port is rejected, while the same listener answers on the
// node's own address.
func TestHostPortProtection(t *testing.T) {
	proxy(t)
	pods := startPods(t, "hostport", 1, []int{8080}, nil)
	ts := createService(t, namespace(t), "hostport", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	ln, err := net.Listen("tcp", ":9099")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nhost-node"))
			c.Close()
		}
	}()
	c := startClient(t, "hostport", "10.20.7.2")
	if name, err := c.GetTCP(nodeIP(t), 9099); err != nil || name != "host-node" {
		t.Fatalf("host listener on the node IP: %q, %v", name, err)
	}
	for _, ask := range []framework.Ask{framework.GetTCP, c.GetTCP} {
		if name, err := ask(ts.VIP, 9099); err == nil {
			t.Errorf("host listener answered (%q) on ClusterIP %s:9099\n%s", name, ts.VIP, framework.DumpKernel())
		} else {
			t.Logf("rejected as expected: %v", err)
		}
	}
	expectAllAnswer(t, c.GetTCP, ts.VIP, 80, 2, pods)
}
