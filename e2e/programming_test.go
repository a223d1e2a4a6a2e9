//go:build e2e

package e2e

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

var (
	httpPort = framework.Port{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8080}
	dnsPort  = framework.Port{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: 5353}
)

// A Service with two ready endpoints is in the kernel within 5 s, and
// round-robin spreads 20 connections over both pods.
func TestServiceTCP(t *testing.T) {
	proxy(t)
	pods := startPods(t, "tcp", 2, []int{8080}, nil)
	ts := createService(t, namespace(t), "web", pods, httpPort)
	waitKernel(t, programTimeout, "VS, real servers, kube-ipvs0 address, set entries", ts.kernelMatches)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 20, pods)
}

// UDP goes through the VIP too.
func TestServiceUDP(t *testing.T) {
	proxy(t)
	pods := startPods(t, "udp", 2, nil, []int{5353})
	ts := createService(t, namespace(t), "dns", pods, dnsPort)
	waitKernel(t, programTimeout, "UDP VS and real servers", ts.kernelMatches)
	expectAllAnswer(t, framework.AskUDP, ts.VIP, 53, 20, pods)
}

// Endpoints scaled 2 -> 5 -> 1: the real servers follow and traffic keeps
// reaching exactly the current pods. Removed servers may linger at weight
// 0 (graceful termination); they must get no traffic.
func TestScaleEndpoints(t *testing.T) {
	proxy(t)
	pods := startPods(t, "scale", 5, []int{8080}, nil)
	ts := createService(t, namespace(t), "scale", pods[:2], httpPort)
	for _, n := range []int{2, 5, 1} {
		ts.setEndpoints(pods[:n]...)
		waitKernel(t, programTimeout, "real servers for "+strconv.Itoa(n)+" endpoints", ts.kernelMatches)
		expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 4*n, pods[:n])
	}
}

// Deleting the Service removes its VS, address and set entries, and
// leaves alone a VS ipvsproxy does not own, even across a full sync.
func TestDeleteServiceKeepsForeignVS(t *testing.T) {
	proxy(t)
	const foreign = "192.0.2.10:80" // TEST-NET-1, not on kube-ipvs0
	if _, err := framework.Run("ipvsadm", "-A", "-t", foreign, "-s", "wlc"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = framework.Run("ipvsadm", "-D", "-t", foreign) })
	if _, err := framework.Run("ipvsadm", "-a", "-t", foreign, "-r", "10.244.250.1:80", "-m", "-w", "3"); err != nil {
		t.Fatal(err)
	}
	created := time.Now()

	pods := startPods(t, "del", 2, []int{8080}, nil)
	ns := namespace(t)
	ts := createService(t, ns, "doomed", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	if err := cluster.DeleteService(ctx(t), ns, "doomed"); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, programTimeout, "service gone from the kernel", ts.gone)

	// Let at least one full sync (which prunes what ipvsproxy owns) run
	// since the foreign VS appeared.
	if wait := framework.SyncPeriod + 2*time.Second - time.Since(created); wait > 0 {
		time.Sleep(wait)
	}
	vss, err := framework.IPVS()
	if err != nil {
		t.Fatal(err)
	}
	vs := vss["TCP "+foreign]
	if vs == nil {
		t.Fatalf("foreign VS %s was deleted\n%s", foreign, framework.DumpKernel())
	}
	if rs, ok := vs.Reals["10.244.250.1:80"]; !ok || rs.Weight != 3 || vs.Scheduler != "wlc" {
		t.Fatalf("foreign VS %s was modified: %+v\n%s", foreign, vs, framework.DumpKernel())
	}
}

// A RequireDualStack Service gets a virtual server per family, both
// ClusterIPs on kube-ipvs0, entries in KUBE-CLUSTER-IP and
// KUBE-6-CLUSTER-IP, and answers through both VIPs.
func TestServiceDualStack(t *testing.T) {
	proxy(t)
	pods := startDualStackPods(t, "ds", 2, []int{8080}, nil)
	spec := framework.ClusterIPService(namespace(t), "dual", httpPort)
	policy := corev1.IPFamilyPolicyRequireDualStack
	spec.Spec.IPFamilyPolicy = &policy
	spec.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	ts := applyService(t, spec, pods)
	if len(ts.svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("API server gave ClusterIPs %v, want one per family", ts.svc.Spec.ClusterIPs)
	}
	waitKernel(t, programTimeout, "both families programmed", ts.kernelMatches)
	for _, vip := range ts.svc.Spec.ClusterIPs {
		expectAllAnswer(t, framework.GetTCP, vip, 80, 10, pods)
	}
}
