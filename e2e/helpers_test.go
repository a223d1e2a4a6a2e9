//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// programTimeout is how long a test waits for a change made through the
// API server to reach the kernel. Waits return as soon as the condition
// holds, so the bound only has to hold on a loaded 2-core host running the
// sandbox (a quiet one takes well under a second; each wait logs its
// time). How fast a change must be is a benchmark's target
// (docs/benchmarks.md), not this bound's.
const programTimeout = 30 * time.Second

// passTimeout is how long a test waits for what only a full pass does
// (drift repair, pruning): the next pass is at most one sync period away,
// and on a loaded host a pass and its iptables-restore take seconds.
const passTimeout = 4 * framework.SyncPeriod

// testService is one Service with its pods and its single EndpointSlice,
// torn down when the test ends.
type testService struct {
	t    *testing.T
	svc  *corev1.Service
	pods []*framework.Pod
	VIP  string
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// namespace gives each test its own namespace, so names never collide.
func namespace(t *testing.T) string {
	ns := "e2e-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(ns) > 63 {
		ns = ns[:63]
	}
	if err := cluster.EnsureNamespace(ctx(t), ns); err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	return ns
}

// startPods starts n pods answering on the given ports; they are stopped
// when the test ends.
func startPods(t *testing.T, prefix string, n int, tcp, udp []int) []*framework.Pod {
	t.Helper()
	var pods []*framework.Pod
	for i := 0; i < n; i++ {
		p, err := framework.StartPod(fmt.Sprintf("%s-%d", prefix, i), framework.NextPodIP(), tcp, udp, results)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		pods = append(pods, p)
	}
	return pods
}

// startDualStackPods is startPods with an IPv6 address on every pod.
func startDualStackPods(t *testing.T, prefix string, n int, tcp, udp []int) []*framework.Pod {
	t.Helper()
	var pods []*framework.Pod
	for i := 0; i < n; i++ {
		ip := framework.NextPodIP()
		p, err := framework.StartDualStackPod(fmt.Sprintf("%s-%d", prefix, i), ip, framework.PodIP6(ip), tcp, udp, results)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		pods = append(pods, p)
	}
	return pods
}

// createService creates a ClusterIP Service and a ready EndpointSlice with pods.
func createService(t *testing.T, ns, name string, pods []*framework.Pod, ports ...framework.Port) *testService {
	t.Helper()
	return applyService(t, framework.ClusterIPService(ns, name, ports...), pods)
}

// applyService creates svc and, per IP family of its ClusterIPs, a ready
// EndpointSlice with the pods.
func applyService(t *testing.T, spec *corev1.Service, pods []*framework.Pod) *testService {
	t.Helper()
	svc, err := cluster.ApplyService(ctx(t), spec)
	if err != nil {
		t.Fatalf("create service: %v", err)
	}
	ts := &testService{t: t, svc: svc, VIP: svc.Spec.ClusterIP}
	t.Cleanup(func() { _ = cluster.DeleteService(context.Background(), svc.Namespace, svc.Name) })
	ts.setEndpoints(pods...)
	t.Logf("service %s/%s ClusterIPs %v, %d endpoints", svc.Namespace, svc.Name, svc.Spec.ClusterIPs, len(pods))
	return ts
}

// setEndpoints rewrites the service's slices to exactly these ready pods.
func (ts *testService) setEndpoints(pods ...*framework.Pod) {
	ts.t.Helper()
	for _, vip := range ts.svc.Spec.ClusterIPs {
		family, name := discoveryv1.AddressTypeIPv4, ts.svc.Name+"-e2e"
		if isV6(vip) {
			family, name = discoveryv1.AddressTypeIPv6, ts.svc.Name+"-e2e-v6"
		}
		es := framework.EndpointSliceForFamily(ts.svc, name, cluster.Node, family, framework.Ready, pods...)
		if _, err := cluster.ApplySlice(ctx(ts.t), es); err != nil {
			ts.t.Fatalf("apply endpointslice: %v", err)
		}
	}
	ts.pods = pods
}

func isV6(ip string) bool { return strings.Contains(ip, ":") }

// podIP is the pod's address in the family of vip.
func podIP(p *framework.Pod, vip string) string {
	if isV6(vip) {
		return p.IP6
	}
	return p.IP
}

// setName is kube-proxy's ipset name for the family of vip: the IPv6 twin
// of KUBE-X is KUBE-6-X.
func setName(base, vip string) string {
	if isV6(vip) {
		return "KUBE-6-" + strings.TrimPrefix(base, "KUBE-")
	}
	return base
}

// vsKey names the virtual server of one service port ("TCP 10.96.0.5:80").
func vsKey(vip string, p corev1.ServicePort) string {
	return string(p.Protocol) + " " + net.JoinHostPort(vip, strconv.Itoa(int(p.Port)))
}

// kernelMatches checks the full picture of the service: per port a VS
// (rr) whose active real servers are exactly the pods (Masq, weight 1), the
// ClusterIP on kube-ipvs0, and the KUBE-CLUSTER-IP / KUBE-LOOP-BACK entries.
func (ts *testService) kernelMatches() error {
	for _, vip := range ts.svc.Spec.ClusterIPs {
		if err := ts.familyMatches(vip); err != nil {
			return err
		}
	}
	return nil
}

func (ts *testService) familyMatches(vip string) error {
	vss, err := framework.IPVS()
	if err != nil {
		return err
	}
	for _, p := range ts.svc.Spec.Ports {
		key := vsKey(vip, p)
		vs := vss[key]
		if vs == nil {
			return fmt.Errorf("no virtual server %s", key)
		}
		if vs.Scheduler != "rr" {
			return fmt.Errorf("%s: scheduler %q, want rr", key, vs.Scheduler)
		}
		var want []string
		for _, pod := range ts.pods {
			addr := net.JoinHostPort(podIP(pod, vip), strconv.Itoa(int(p.TargetPort.IntVal)))
			want = append(want, addr)
			rs, ok := vs.Reals[addr]
			if !ok {
				return fmt.Errorf("%s: real server %s missing (have %v)", key, addr, vs.ActiveReals())
			}
			if rs.Forward != "m" || rs.Weight != 1 {
				return fmt.Errorf("%s -> %s: forward %q weight %d, want masq weight 1", key, addr, rs.Forward, rs.Weight)
			}
		}
		sort.Strings(want)
		if got := vs.ActiveReals(); strings.Join(got, " ") != strings.Join(want, " ") {
			return fmt.Errorf("%s: active real servers %v, want %v", key, got, want)
		}
	}
	if ok, err := framework.HasAddr("kube-ipvs0", vip); err != nil || !ok {
		return fmt.Errorf("ClusterIP %s not on kube-ipvs0 (err %v)", vip, err)
	}
	return ts.setEntries(vip, true)
}

// setEntries checks that the ipset entries of the service are all present
// (want true) or all absent.
func (ts *testService) setEntries(vip string, want bool) error {
	clusterIPSet, loopBackSet := setName("KUBE-CLUSTER-IP", vip), setName("KUBE-LOOP-BACK", vip)
	clusterIPs, err := framework.SetMembers(clusterIPSet)
	if err != nil {
		return err
	}
	loopBack, err := framework.SetMembers(loopBackSet)
	if err != nil {
		return err
	}
	for _, p := range ts.svc.Spec.Ports {
		proto := strings.ToLower(string(p.Protocol))
		e := fmt.Sprintf("%s,%s:%d", vip, proto, p.Port)
		if clusterIPs[e] != want {
			return fmt.Errorf("%s entry %s present=%v, want %v", clusterIPSet, e, clusterIPs[e], want)
		}
		if !want {
			continue // loop-back entries belong to endpoints, checked while they exist
		}
		for _, pod := range ts.pods {
			ip := podIP(pod, vip)
			e := fmt.Sprintf("%s,%s:%d,%s", ip, proto, p.TargetPort.IntVal, ip)
			if !loopBack[e] {
				return fmt.Errorf("%s entry %s missing", loopBackSet, e)
			}
		}
	}
	return nil
}

// gone checks that nothing of the service is left in the kernel.
func (ts *testService) gone() error {
	vss, err := framework.IPVS()
	if err != nil {
		return err
	}
	for _, vip := range ts.svc.Spec.ClusterIPs {
		for _, p := range ts.svc.Spec.Ports {
			if vs := vss[vsKey(vip, p)]; vs != nil {
				return fmt.Errorf("virtual server %s still there with %v", vs.Key(), vs.ActiveReals())
			}
		}
		if ok, err := framework.HasAddr("kube-ipvs0", vip); err != nil || ok {
			return fmt.Errorf("ClusterIP %s still on kube-ipvs0 (err %v)", vip, err)
		}
		if err := ts.setEntries(vip, false); err != nil {
			return err
		}
	}
	return nil
}

// waitKernel waits up to timeout for check, failing with the kernel dump.
func waitKernel(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	start := time.Now()
	if err := framework.Eventually(timeout, 100*time.Millisecond, check); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, framework.DumpKernel())
	}
	t.Logf("%s: after %v", what, time.Since(start).Round(time.Millisecond))
}

// expectAllAnswer makes n requests and requires no failure and an answer
// from every pod in want (and from no other).
func expectAllAnswer(t *testing.T, ask framework.Ask, ip string, port, n int, want []*framework.Pod) {
	t.Helper()
	tally := framework.Repeat(ask, ip, port, n)
	t.Logf("%s:%d: %v", ip, port, tally)
	if len(tally.Errors) > 0 {
		t.Fatalf("%s:%d: %v\n%s", ip, port, tally, framework.DumpKernel())
	}
	names := map[string]bool{}
	for _, p := range want {
		names[p.Name] = true
		if tally.ByPod[p.Name] == 0 {
			t.Errorf("%s:%d: pod %s never answered: %v", ip, port, p.Name, tally)
		}
	}
	for name := range tally.ByPod {
		if !names[name] {
			t.Errorf("%s:%d: answer from %s, which is not an endpoint: %v", ip, port, name, tally)
		}
	}
}
