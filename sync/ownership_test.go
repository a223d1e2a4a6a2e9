package sync

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// webNodePort is the NodePort Service default/web: 10.96.0.10:80, node
// port 30080/TCP, one endpoint.
func webNodePort(e *engine) {
	s := svc("default", "web", "10.96.0.10", "80")
	s.Spec.Type = v1.ServiceTypeNodePort
	s.Spec.Ports[0].NodePort = 30080
	e.apply(s, slice("default", "web", "web-1", "", 8080, v1.ProtocolTCP, ep{ip: "10.244.1.7"}))
}

func addVS(t testing.TB, k *kernel, addr string, proto ipvs.Protocol, port uint16) {
	t.Helper()
	must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{
		ServiceKey: ipvs.ServiceKey{Address: netip.MustParseAddr(addr), Protocol: proto, Port: port}, Scheduler: "wrr"}))
}

// A virtual server someone else made on a node-port number, on an address
// ipvsproxy does not serve node ports on, is not ipvsproxy's: the full
// pass leaves it (issue #16, item 5).
func TestPruneLeavesForeignVSOnNodePortNumber(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.cfg.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.1.10")}
	e.rec.SetNodePortAddresses(e.cfg.NodePortAddresses)
	webNodePort(e)
	addVS(t, k, "192.0.2.20", ipvs.TCP, 30080)   // a load balancer's VIP, say
	addVS(t, k, "192.168.1.11", ipvs.TCP, 30080) // a node address outside --nodeport-addresses
	e.full()
	for _, want := range []string{"-A -t 192.0.2.20:30080 -s wrr", "-A -t 192.168.1.11:30080 -s wrr", "-A -t 192.168.1.10:30080 -s rr"} {
		if !strings.Contains(k.IPVS.String(), want) {
			t.Errorf("after a full pass ipvsadm -Sn lacks %q:\n%s", want, k.IPVS)
		}
	}
}

// A node-port virtual server ipvsproxy made is still removed when its
// address stops being a node-port address (the node lost it), though the
// exact rule no longer covers it: ipvsproxy made it.
func TestPruneRemovesNodePortOfRemovedAddress(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.cfg.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.1.11")}
	e.rec.SetNodePortAddresses(e.cfg.NodePortAddresses)
	webNodePort(e)
	e.full()
	e.cfg.NodePortAddresses = e.cfg.NodePortAddresses[:1]
	e.rec.SetNodePortAddresses(e.cfg.NodePortAddresses)
	e.full()
	assertText(t, "kernel after the node lost 192.168.1.11", k.text(), e.reference())
	if strings.Contains(k.IPVS.String(), "192.168.1.11") {
		t.Errorf("the node port of the removed address is still there:\n%s", k.IPVS)
	}
}

// The runner gives the reconciler the node-port addresses the node
// watcher reported: after a restart, a node port left by a Service deleted
// meanwhile is pruned on a node-port address, and a foreign virtual
// server on the same number elsewhere is kept.
func TestRunnerPrunesNodePortsOnNodePortAddresses(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.cfg.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.1.10")}
	webNodePort(e)
	addVS(t, k, "192.0.2.20", ipvs.TCP, 30080)

	restarted := newEngine(t, k)
	runner := NewRunner(RunnerConfig{Build: testConfig}, NewTracker(), restarted.rec)
	runner.UpdateNode(NodeFacts{NodePortAddresses: e.cfg.NodePortAddresses})
	runner.informersSynced.Store(true)
	runner.requestPass() // the first pass, once the informers have synced
	ctx := context.Background()
	for runner.next(ctx); runner.passInProgress(); runner.next(ctx) {
	}
	assertText(t, "ipvsadm -Sn after the first pass", k.IPVS.String(), "-A -t 192.0.2.20:30080 -s wrr")
}

// A pass that read web back after the node lost an address, then was
// abandoned for a newer pass (another node change), still leaves the
// newer pass to prune the node port of the lost address.
func TestPruneRemovesNodePortOfRemovedAddressAfterAbandonedPass(t *testing.T) {
	k := newKernel(t)
	e := newEngine(t, k)
	e.cfg.NodePortAddresses = []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.1.11")}
	webNodePort(e)
	e.cfg.NodePortAddresses = e.cfg.NodePortAddresses[:1]
	e.rec.SetNodePortAddresses(e.cfg.NodePortAddresses)
	e.beginPass()
	e.step()
	if left := e.rec.servicesLeftInPass(); left != 0 {
		t.Fatalf("the pass has %d services besides web to do; the test needs web's step to be the last", left)
	}
	e.beginPass() // a node change: the pass starts over
	for !e.step() {
	}
	e.finishPass()
	if strings.Contains(k.IPVS.String(), "192.168.1.11") {
		t.Errorf("the node port of the removed address is still there:\n%s", k.IPVS)
	}
}
