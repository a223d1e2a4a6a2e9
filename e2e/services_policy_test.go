//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 4, continued: externalTrafficPolicy=Local with its health-check
// node port, terminating endpoints, an IPv6-only Service, per-service
// schedulers and their Warning Events.

// otherNode is the nodeName of endpoints that are not on this node; no
// Node object is needed for it.
const otherNode = "e2e-other-node"

// setPlacedEndpoints writes the service's IPv4 slice: local pods on this
// node, remote pods on otherNode, all ready.
func setPlacedEndpoints(t *testing.T, ts *testService, local, remote []*framework.Pod) {
	t.Helper()
	es := framework.EndpointSliceFor(ts.svc, ts.svc.Name+"-e2e", cluster.Node, framework.Ready, append(append([]*framework.Pod{}, local...), remote...)...)
	for i := len(local); i < len(es.Endpoints); i++ {
		n := otherNode
		es.Endpoints[i].NodeName = &n
	}
	if _, err := cluster.ApplySlice(ctx(t), es); err != nil {
		t.Fatalf("apply endpointslice: %v", err)
	}
}

// waitHealthCheck waits until the health-check node port answers code
// with localEndpoints = local for the service.
func waitHealthCheck(t *testing.T, ts *testService, ip string, port, code, local int) {
	t.Helper()
	waitKernel(t, programTimeout, fmt.Sprintf("health check %s:%d says %d, %d local", ip, port, code, local), func() error {
		got, body, err := framework.HealthCheck(ip, port)
		if err != nil {
			return err
		}
		if got != code || body.LocalEndpoints != local || body.Service.Namespace != ts.svc.Namespace || body.Service.Name != ts.svc.Name {
			return fmt.Errorf("HTTP %d %+v, want %d with localEndpoints %d for %s/%s", got, body, code, local, ts.svc.Namespace, ts.svc.Name)
		}
		return nil
	})
}

// externalTrafficPolicy=Local: the node port and the LB IP send only to
// the endpoints on this node (the ClusterIP to all); the health-check node
// port (set explicitly) says 200 with the local count, and 503 with 0
// once every endpoint is on another node.
func TestExternalTrafficPolicyLocal(t *testing.T) {
	proxy(t)
	const lbIP, hcPort = "203.0.113.30", 31990
	local := startPods(t, "etp-local", 2, []int{8080}, nil)
	remote := startPods(t, "etp-remote", 1, []int{8080}, nil)
	all := append(append([]*framework.Pod{}, local...), remote...)
	ns := namespace(t)
	spec := framework.LoadBalancerService(ns, "etp", httpPort)
	spec.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	spec.Spec.HealthCheckNodePort = hcPort
	ts := applyService(t, spec, nil)
	if ts.svc.Spec.HealthCheckNodePort != hcPort {
		t.Fatalf("API server kept healthCheckNodePort %d, want %d", ts.svc.Spec.HealthCheckNodePort, hcPort)
	}
	if _, err := cluster.SetLoadBalancerIngress(ctx(t), ns, "etp", lbIP); err != nil {
		t.Fatal(err)
	}
	setPlacedEndpoints(t, ts, local, remote)
	node, np := nodeIP(t), int(ts.svc.Spec.Ports[0].NodePort)

	waitReals(t, vs(corev1.ProtocolTCP, ts.VIP, 80), reals(all, 8080))
	waitReals(t, vs(corev1.ProtocolTCP, node, np), reals(local, 8080))
	waitReals(t, vs(corev1.ProtocolTCP, lbIP, 80), reals(local, 8080))
	expectAllAnswer(t, framework.GetTCP, node, np, 10, local)
	c := startClient(t, "etp", "10.20.5.2")
	expectAllAnswer(t, c.GetTCP, lbIP, 80, 10, local)
	expectAllAnswer(t, c.GetTCP, node, np, 10, local)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 12, all)
	waitHealthCheck(t, ts, node, hcPort, 200, 2)

	setPlacedEndpoints(t, ts, nil, all)
	waitHealthCheck(t, ts, node, hcPort, 503, 0)
	// No local endpoint: external traffic has no backend on this node.
	for _, key := range []string{vs(corev1.ProtocolTCP, node, np), vs(corev1.ProtocolTCP, lbIP, 80)} {
		waitNoBackend(t, key)
	}
	if name, err := framework.GetTCP(node, np); err == nil {
		t.Errorf("node port %s:%d answered by %s with no local endpoint", node, np, name)
	}
	waitReals(t, vs(corev1.ProtocolTCP, ts.VIP, 80), reals(all, 8080))
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 12, all)
}

// internalTrafficPolicy=Local: the ClusterIP sends only to the endpoints
// on this node.
func TestInternalTrafficPolicyLocal(t *testing.T) {
	proxy(t)
	local := startPods(t, "itp-local", 1, []int{8080}, nil)
	remote := startPods(t, "itp-remote", 1, []int{8080}, nil)
	spec := framework.ClusterIPService(namespace(t), "itp", httpPort)
	itp := corev1.ServiceInternalTrafficPolicyLocal
	spec.Spec.InternalTrafficPolicy = &itp
	ts := applyService(t, spec, nil)
	setPlacedEndpoints(t, ts, local, remote)
	waitReals(t, vs(corev1.ProtocolTCP, ts.VIP, 80), reals(local, 8080))
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 6, local)
}

// Endpoints that are all terminating but still serving keep the service
// answering (fallback); once a ready endpoint exists, only it gets new
// connections.
func TestTerminatingEndpoints(t *testing.T) {
	proxy(t)
	pods := startPods(t, "term", 2, []int{8080}, nil)
	ts := createService(t, namespace(t), "term", nil, httpPort)
	terminating := framework.EndpointState{Ready: false, Serving: true, Terminating: true}
	es := framework.EndpointSliceFor(ts.svc, "term-e2e", cluster.Node, terminating, pods...)
	if _, err := cluster.ApplySlice(ctx(t), es); err != nil {
		t.Fatal(err)
	}
	key := vs(corev1.ProtocolTCP, ts.VIP, 80)
	waitReals(t, key, reals(pods, 8080))
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)

	yes := true
	es.Endpoints[0].Conditions.Ready, es.Endpoints[0].Conditions.Terminating = &yes, new(bool)
	if _, err := cluster.ApplySlice(ctx(t), es); err != nil {
		t.Fatal(err)
	}
	waitReals(t, key, reals(pods[:1], 8080))
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 6, pods[:1])
}

// A single-stack IPv6 Service: VS, kube-ipvs0 address and KUBE-6- set
// entries, TCP and UDP answered over IPv6 (TestServiceDualStack covers
// TCP through both families of a dual-stack Service).
func TestServiceIPv6Only(t *testing.T) {
	proxy(t)
	pods := startDualStackPods(t, "v6", 2, []int{8080}, []int{5353})
	spec := framework.ClusterIPService(namespace(t), "v6", httpPort, dnsPort)
	single := corev1.IPFamilyPolicySingleStack
	spec.Spec.IPFamilyPolicy = &single
	spec.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	ts := applyService(t, spec, pods)
	if len(ts.svc.Spec.ClusterIPs) != 1 || !isV6(ts.VIP) {
		t.Fatalf("API server gave ClusterIPs %v, want one IPv6 address", ts.svc.Spec.ClusterIPs)
	}
	waitKernel(t, programTimeout, "IPv6 VS, address, KUBE-6- entries", ts.kernelMatches)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)
	expectAllAnswer(t, framework.AskUDP, ts.VIP, 53, 10, pods)
}

// ipvsproxy.io/scheduler: sh with scheduler-flags sh-port shows in
// ipvsadm -Ln; an unknown scheduler gives a Warning Event
// (IPVSProxyInvalidService) and the default rr; changing the annotation
// to a valid one switches the scheduler.
func TestSchedulerAnnotation(t *testing.T) {
	proxy(t)
	pods := startPods(t, "sched", 2, []int{8080}, nil)
	ns := namespace(t)
	spec := framework.ClusterIPService(ns, "sh", httpPort)
	spec.Annotations = map[string]string{"ipvsproxy.io/scheduler": "sh", "ipvsproxy.io/scheduler-flags": "sh-port"}
	sh := applyService(t, spec, pods)
	shKey := vs(corev1.ProtocolTCP, sh.VIP, 80)
	waitKernel(t, programTimeout, "sh with sh-port in ipvsadm -Ln", func() error {
		line, err := framework.VSLine(shKey)
		if err == nil && (!strings.Contains(line, " sh ") || !strings.Contains(line, "sh-port")) {
			err = fmt.Errorf("ipvsadm -Ln line %q: want scheduler sh with flag sh-port", line)
		}
		return err
	})
	waitReals(t, shKey, reals(pods, 8080))
	if line, err := framework.VSLine(shKey); err == nil {
		t.Logf("ipvsadm -Ln: %s", line)
	}
	tally := framework.Repeat(framework.GetTCP, sh.VIP, 80, 10)
	if len(tally.Errors) > 0 {
		t.Fatalf("through the sh VS: %v", tally)
	}

	spec = framework.ClusterIPService(ns, "bad", httpPort)
	spec.Annotations = map[string]string{"ipvsproxy.io/scheduler": "bogus"}
	bad := applyService(t, spec, pods)
	badKey := vs(corev1.ProtocolTCP, bad.VIP, 80)
	waitKernel(t, programTimeout, "Warning Event IPVSProxyInvalidService", func() error {
		evs, err := cluster.WarningEvents(ctx(t), ns, "bad")
		if err != nil {
			return err
		}
		for _, e := range evs {
			if strings.HasPrefix(e, "IPVSProxyInvalidService: ") && strings.Contains(e, "bogus") {
				t.Logf("event: %s", e)
				return nil
			}
		}
		return fmt.Errorf("no IPVSProxyInvalidService event naming \"bogus\" (have %q)", evs)
	})
	waitSchedulerIs(t, badKey, "rr")
	// The virtual server can be there before the EndpointSlice is.
	waitReals(t, badKey, reals(pods, 8080))
	expectAllAnswer(t, framework.GetTCP, bad.VIP, 80, 10, pods)

	if _, err := cluster.UpdateService(ctx(t), ns, "bad", func(s *corev1.Service) {
		s.Annotations["ipvsproxy.io/scheduler"] = "wlc"
	}); err != nil {
		t.Fatal(err)
	}
	waitSchedulerIs(t, badKey, "wlc")
	expectAllAnswer(t, framework.GetTCP, bad.VIP, 80, 10, pods)
}

// waitNoBackend waits until virtual server key is gone or has no active
// real server.
func waitNoBackend(t *testing.T, key string) {
	t.Helper()
	waitKernel(t, programTimeout, key+" without backends", func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if v := vss[key]; v != nil && len(v.ActiveReals()) > 0 {
			return fmt.Errorf("%s still sends to %v", key, v.ActiveReals())
		}
		return nil
	})
}

func waitSchedulerIs(t *testing.T, key, sched string) {
	t.Helper()
	waitKernel(t, programTimeout, key+" scheduler "+sched, func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if v := vss[key]; v == nil || v.Scheduler != sched {
			return fmt.Errorf("%s: %+v, want scheduler %s", key, v, sched)
		}
		return nil
	})
}
