//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 16, item 2: one Service the kernel keeps refusing is that Service's
// problem, never the node's.

// nodeBroadcast is the broadcast address of node0's subnet, from the
// kernel's local routing table: IPVS refuses a real server whose address
// is not unicast there (EINVAL), while the API server accepts it in an
// EndpointSlice and the builder takes it (it is a global unicast address
// to anyone who does not know the node's subnets). A tenant who can write
// an EndpointSlice can make such a Service.
func nodeBroadcast(t *testing.T) string {
	t.Helper()
	out, err := framework.Run("ip", "-4", "route", "show", "table", "local", "type", "broadcast", "dev", "node0")
	if err != nil {
		t.Fatal(err)
	}
	// "10.10.0.255 proto kernel ..." or, as newer kernels print the
	// route type too, "broadcast 10.10.0.255 proto kernel ...".
	for _, l := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(l) {
			if ip := net.ParseIP(f); ip != nil && strings.HasSuffix(f, ".255") {
				return f
			}
		}
	}
	t.Fatalf("no x.x.x.255 broadcast route of node0 in the local table:\n%s", out)
	return ""
}

// refusedService creates a selectorless Service whose only endpoint is
// addr, and returns the key of its virtual server.
func refusedService(t *testing.T, ns, name, addr string) string {
	t.Helper()
	ts := applyService(t, framework.ClusterIPService(ns, name, httpPort), nil)
	es := framework.EndpointSliceFor(ts.svc, name+"-e2e", cluster.Node, framework.Ready)
	ready := true
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
	})
	if _, err := cluster.ApplySlice(ctx(t), es); err != nil {
		t.Fatalf("EndpointSlice with %s: %v", addr, err)
	}
	return vsKey(ts.VIP, ts.svc.Spec.Ports[0])
}

// waitSyncFailedEvent waits for the Warning Event that names the kernel's
// refusal of addr.
func waitSyncFailedEvent(t *testing.T, ns, name, addr string) {
	t.Helper()
	want := "IPVSProxySyncFailed: programming this Service failed; retrying with backoff: add real server " + addr + ":8080"
	waitKernel(t, 2*framework.SyncPeriod, "the IPVSProxySyncFailed Warning Event", func() error {
		evs, err := cluster.WarningEvents(ctx(t), ns, name)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if strings.HasPrefix(e, want) && strings.HasSuffix(e, ": invalid argument") {
				t.Logf("Warning Event: %s", e)
				return nil
			}
		}
		return fmt.Errorf("Warning Events %q, want one starting %q and ending in the kernel's EINVAL", evs, want)
	})
}

// TestFailingServiceKeepsNodeHealthy: a Service whose real server the
// real kernel refuses forever (node0's subnet broadcast address). For 2.5 ×
// the sync period — past the 2 × syncPeriod after which a pending change
// makes the node unhealthy — /healthz, /livez and the health-check node
// port of another Service answer 200; the failing Service has a Warning
// Event naming the kernel's error and is counted in
// ipvsproxy_services_sync_failing; a Service created afterwards is
// programmed and answers.
func TestFailingServiceKeepsNodeHealthy(t *testing.T) {
	p := proxy(t)
	const lbIP, hcPort = "203.0.113.31", 31991
	ns := namespace(t)
	local := startPods(t, "failing-etp", 1, []int{8080}, nil)
	spec := framework.LoadBalancerService(ns, "etp", httpPort)
	spec.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	spec.Spec.HealthCheckNodePort = hcPort
	etp := applyService(t, spec, nil)
	if _, err := cluster.SetLoadBalancerIngress(ctx(t), ns, "etp", lbIP); err != nil {
		t.Fatal(err)
	}
	setPlacedEndpoints(t, etp, local, nil)
	node := nodeIP(t)
	waitHealthCheck(t, etp, node, hcPort, http.StatusOK, 1)

	bcast := nodeBroadcast(t)
	key := refusedService(t, ns, "refused", bcast)
	waitKernel(t, programTimeout, "the refused Service's virtual server", func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if vss[key] == nil {
			return fmt.Errorf("no virtual server %s", key)
		}
		return nil
	})
	waitSyncFailedEvent(t, ns, "refused", bcast)

	urls := []string{p.Healthz, strings.TrimSuffix(p.Healthz, "/healthz") + "/livez"}
	for end := time.Now().Add(framework.SyncPeriod * 5 / 2); time.Now().Before(end); time.Sleep(time.Second) {
		for _, u := range urls {
			if code, body, err := framework.Healthz(u); err != nil || code != http.StatusOK {
				t.Fatalf("%s answered %d %q (%v) while one Service keeps failing", u, code, body, err)
			}
		}
		if code, body, err := framework.HealthCheck(node, hcPort); err != nil || code != http.StatusOK {
			t.Fatalf("health-check node port %d answered %d %+v (%v) while another Service keeps failing", hcPort, code, body, err)
		}
	}
	if n, err := framework.Metric("ipvsproxy_services_sync_failing"); err != nil || n < 1 {
		t.Errorf("ipvsproxy_services_sync_failing = %v (%v), want at least 1", n, err)
	}

	pods := startPods(t, "failing-late", 2, []int{8080}, nil)
	late := createService(t, ns, "late", pods, httpPort)
	waitKernel(t, programTimeout, "a Service created while another keeps failing", late.kernelMatches)
	expectAllAnswer(t, framework.GetTCP, late.VIP, 80, 10, pods)
}
