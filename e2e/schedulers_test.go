//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// Issue 21: schedulers worth having across many nodes — twos, a per-node
// real-server order that a restart keeps, and weights by zone.

// TestSchedulerTwos: a Service annotated with the twos scheduler (the
// newest; both sandbox kernels have it) is programmed with it, as ipvsadm
// shows, and every backend answers through it.
func TestSchedulerTwos(t *testing.T) {
	proxy(t)
	pods := startPods(t, "twos", 3, []int{8080}, nil)
	spec := framework.ClusterIPService(namespace(t), "twos", httpPort)
	spec.Annotations = map[string]string{sync.AnnotationScheduler: "twos"}
	ts := applyService(t, spec, pods)
	key := vs(corev1.ProtocolTCP, ts.VIP, 80)
	waitKernel(t, programTimeout, key+" with scheduler twos", func() error {
		line, err := framework.VSRule(key)
		if err == nil && !strings.Contains(line, " -s twos") {
			err = fmt.Errorf("ipvsadm -Sn line %q: want scheduler twos", line)
		}
		return err
	})
	waitReals(t, key, reals(pods, 8080))
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 30, pods)
}

// orderNode is the second node name TestRealServerOrderPerNode runs a
// proxy under.
const orderNode = "e2e-order-node-b"

// TestRealServerOrderPerNode: a proxy adds a virtual server's eight real
// servers in the order its node name gives (sync.AddOrder), so the kernel
// lists them in the reverse of it (ipvsadm -Ln --nosort) and rr's first
// connection goes to the first listed; a proxy under another node name
// (--hostname-override) programs the same service in another order; and a
// restart of either keeps the kernel's order (adoption writes nothing).
func TestRealServerOrderPerNode(t *testing.T) {
	p := proxy(t)
	pods := startPods(t, "order", 8, []int{8080}, nil)
	ts := createService(t, namespace(t), "order", pods, httpPort)
	waitKernel(t, programTimeout, "service order", ts.kernelMatches)
	key := vsKey(ts.VIP, ts.svc.Spec.Ports[0])
	mine := expectOrder(t, ts, cluster.Node)
	restartKeepsOrder(t, p, key, mine)

	theirs := kernelOrder(t, ts, orderNode)
	if slices.Equal(mine, theirs) {
		t.Fatalf("nodes %s and %s predict the same order %v: pick another node name", cluster.Node, orderNode, mine)
	}
	if err := cluster.RegisterNode(ctx(t), orderNode, "10.10.0.1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), orderNode, metav1.DeleteOptions{})
	})
	// The other proxy adopts what is there and writes nothing: to see the
	// order it adds in, the virtual server must be new to it.
	other := proxyAfter(t, "node-b", func() {
		if _, err := framework.Run("ipvsadm", "-D", "-t", net.JoinHostPort(ts.VIP, "80")); err != nil {
			t.Fatal(err)
		}
	}, "--hostname-override", orderNode)
	expectOrder(t, ts, orderNode)
	first, err := framework.GetTCP(ts.VIP, 80)
	if want := podAt(pods, theirs[0]); err != nil || first != want {
		t.Errorf("first connection under rr answered by %q (%v), want %s, the head of the kernel's list %v", first, err, want, theirs)
	}
	restartKeepsOrder(t, other, key, theirs)
}

// kernelOrder is the order the kernel lists ts's real servers in when a
// proxy on node added them: the reverse of sync.AddOrder.
func kernelOrder(t *testing.T, ts *testService, node string) []string {
	t.Helper()
	sk := ipvs.VirtualServer{ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr(ts.VIP), Protocol: ipvs.TCP, Port: 80}, Scheduler: "rr"}
	var rks []ipvs.RealKey
	for _, p := range ts.pods {
		rks = append(rks, ipvs.RealKey{Address: netip.MustParseAddr(p.IP), Port: 8080})
	}
	var out []string
	for _, k := range sync.AddOrder(node, sk, rks) {
		out = append(out, k.String())
	}
	slices.Reverse(out)
	return out
}

// expectOrder waits until the kernel lists ts's real servers as a proxy on
// node adds them, and returns that order.
func expectOrder(t *testing.T, ts *testService, node string) []string {
	t.Helper()
	key := vsKey(ts.VIP, ts.svc.Spec.Ports[0])
	want := kernelOrder(t, ts, node)
	waitKernel(t, programTimeout, fmt.Sprintf("%s in node %s's order", key, node), func() error {
		got, err := framework.RealOrder(key)
		if err == nil && !slices.Equal(got, want) {
			err = fmt.Errorf("ipvsadm -Ln --nosort lists %v, want %v", got, want)
		}
		return err
	})
	return want
}

// restartKeepsOrder restarts p and, once its first full pass is done,
// expects the kernel's order of key's real servers unchanged.
func restartKeepsOrder(t *testing.T, p *framework.Proxy, key string, want []string) {
	t.Helper()
	if err := p.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	waitFirstPass(t)
	if got, err := framework.RealOrder(key); err != nil || !slices.Equal(got, want) {
		t.Errorf("after a restart ipvsadm -Ln --nosort lists %v (%v), want the order before it, %v", got, err, want)
	}
}

// podAt names the pod whose real server is addr ("10.244.0.5:8080").
func podAt(pods []*framework.Pod, addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	for _, p := range pods {
		if p.IP == host {
			return p.Name
		}
	}
	return "no pod at " + addr
}

// TestWeightsAnnotationTraffic: with ipvsproxy.io/weights
// "zone=zone-a:3,zone=zone-b:1" and wrr, the backend in zone-a gets three
// connections for every one of zone-b's; swapping the weights swaps the
// shares (updated in place); a bad value gets a Warning Event and weight
// 1 for both.
func TestWeightsAnnotationTraffic(t *testing.T) {
	proxy(t)
	ns := namespace(t)
	pods := startPods(t, "weights", 2, []int{8080}, nil)
	spec := framework.ClusterIPService(ns, "weights", httpPort)
	spec.Annotations = map[string]string{sync.AnnotationScheduler: "wrr", sync.AnnotationWeights: "zone=zone-a:3,zone=zone-b:1"}
	ts := applyService(t, spec, pods)
	es := framework.EndpointSliceFor(ts.svc, ts.svc.Name+"-e2e", cluster.Node, framework.Ready, pods...)
	es.Endpoints[0].Zone, es.Endpoints[1].Zone = ptr.To("zone-a"), ptr.To("zone-b")
	if _, err := cluster.ApplySlice(ctx(t), es); err != nil {
		t.Fatal(err)
	}
	key := vs(corev1.ProtocolTCP, ts.VIP, 80)
	waitWeights(t, key, pods, 3, 1)
	expectShare(t, ts, pods[0], 0.75)

	setWeights(t, ns, "zone=zone-a:1,zone=zone-b:3")
	waitWeights(t, key, pods, 1, 3)
	expectShare(t, ts, pods[1], 0.75)

	setWeights(t, ns, "zone=zone-a:lots")
	waitWeights(t, key, pods, 1, 1)
	waitKernel(t, programTimeout, "Warning Event about "+sync.AnnotationWeights, func() error {
		evs, err := cluster.WarningEvents(ctx(t), ns, "weights")
		for _, e := range evs {
			if strings.HasPrefix(e, "IPVSProxyInvalidService: ") && strings.Contains(e, sync.AnnotationWeights) && strings.Contains(e, `"lots"`) {
				t.Logf("event: %s", e)
				return nil
			}
		}
		return fmt.Errorf("Warning Events %q (%v), want one about %s", evs, err, sync.AnnotationWeights)
	})
}

func setWeights(t *testing.T, ns, weights string) {
	t.Helper()
	if _, err := cluster.UpdateService(ctx(t), ns, "weights", func(s *corev1.Service) {
		s.Annotations[sync.AnnotationWeights] = weights
	}); err != nil {
		t.Fatal(err)
	}
}

// waitWeights waits until key's real servers of pods a and b have the
// weights wa and wb.
func waitWeights(t *testing.T, key string, pods []*framework.Pod, wa, wb int) {
	t.Helper()
	waitKernel(t, programTimeout, fmt.Sprintf("%s weights %d and %d", key, wa, wb), func() error {
		v, err := framework.VirtualServerOf(key)
		if err != nil {
			return err
		}
		for i, w := range []int{wa, wb} {
			addr := net.JoinHostPort(pods[i].IP, strconv.Itoa(8080))
			if got := v.Reals[addr].Weight; got != w {
				return fmt.Errorf("%s -> %s: weight %d, want %d (reals %+v)", key, addr, got, w, v.Reals)
			}
		}
		return nil
	})
}

// expectShare makes 200 requests and expects pod to answer about share of
// them: wrr is exact (150 of 200 at 3:1), so the bound only allows for a
// few failed or retried connections on a loaded host.
func expectShare(t *testing.T, ts *testService, pod *framework.Pod, share float64) {
	t.Helper()
	const n = 200
	tally := framework.Repeat(framework.GetTCP, ts.VIP, 80, n)
	t.Logf("%s:80: %v", ts.VIP, tally)
	if len(tally.Errors) > n/20 {
		t.Fatalf("%d of %d requests failed: %v\n%s", len(tally.Errors), n, tally, framework.DumpKernel())
	}
	got := float64(tally.ByPod[pod.Name]) / float64(tally.Total()-len(tally.Errors))
	if got < share-0.1 || got > share+0.1 {
		t.Errorf("%s answered %.0f%% of the requests, want %.0f%% ± 10: %v", pod.Name, 100*got, 100*share, tally)
	}
}
