//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 4, node addresses: NodePort virtual servers follow the addresses
// on the node's interfaces (except kube-ipvs0) as they come and go, within
// --nodeport-addresses. ipvsproxy reads the addresses every
// nodeAddrPollPeriod (cmd/ipvsproxy/app/nodewatch.go, run.go) and then
// syncs the services with node ports, as for any change: the proxy here
// runs with a sync period of an hour, so no periodic full pass can be the
// one that follows the address.

// nodeAddrPollPeriod is how often ipvsproxy reads the node's addresses.
const nodeAddrPollPeriod = 5 * time.Second

// nodeAddrTimeout is how long an address change may take to show: one
// poll period, then the programming time of any change.
const nodeAddrTimeout = nodeAddrPollPeriod + programTimeout

// addNodeAddr puts ip/32 on the node's link node0 until the test ends
// (unless the test removed it already).
func addNodeAddr(t *testing.T, ip string) {
	t.Helper()
	if _, err := framework.Run("ip", "addr", "add", ip+"/32", "dev", "node0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ok, _ := framework.HasAddr("node0", ip); ok {
			_ = framework.DelAddr("node0", ip)
		}
	})
}

// waitNoVS waits until there is no virtual server key.
func waitNoVS(t *testing.T, timeout time.Duration, key string) {
	t.Helper()
	waitKernel(t, timeout, "no virtual server "+key, func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if v := vss[key]; v != nil {
			return fmt.Errorf("virtual server %s still there with %v", key, v.ActiveReals())
		}
		return nil
	})
}

// waitRealsWithin is waitReals with its own timeout.
func waitRealsWithin(t *testing.T, timeout time.Duration, key string, want []string) {
	t.Helper()
	waitKernel(t, timeout, "virtual server "+key, func() error {
		v, err := framework.VirtualServerOf(key)
		if err != nil {
			return err
		}
		if got := v.ActiveReals(); !slices.Equal(got, want) {
			return fmt.Errorf("%s: active real servers %v, want %v", key, got, want)
		}
		return nil
	})
}

// nodePortService starts two backends behind a NodePort service and waits
// until the node port answers on the Node's InternalIP; it returns the
// service and its node port.
func nodePortService(t *testing.T, name string) (*testService, int) {
	t.Helper()
	pods := startPods(t, name, 2, []int{8080}, nil)
	ts := applyService(t, framework.NodePortService(namespace(t), name, httpPort), pods)
	np := int(ts.svc.Spec.Ports[0].NodePort)
	if np == 0 {
		t.Fatalf("API server allocated no node port: %+v", ts.svc.Spec.Ports)
	}
	waitReals(t, vs(corev1.ProtocolTCP, nodeIP(t), np), reals(pods, 8080))
	return ts, np
}

// With the default --nodeport-addresses (every address): an address added
// to a node interface gets the service's node port, reached from the node
// and from a client; removed, its virtual server goes, and the node IP's
// stays. kube-ipvs0's addresses (the ClusterIP) never get one.
func TestNodeAddrAddedAndRemoved(t *testing.T) {
	proxyWith(t, "node-addresses", "--ipvs-sync-period", "1h")
	ts, np := nodePortService(t, "na")
	const added = "10.11.0.50" // outside node0's 10.10.0.0/24: any address counts
	addNodeAddr(t, added)
	key := vs(corev1.ProtocolTCP, added, np)
	waitRealsWithin(t, nodeAddrTimeout, key, reals(ts.pods, 8080))
	expectAllAnswer(t, framework.GetTCP, added, np, 10, ts.pods)
	c := startClient(t, "na", "10.20.8.2")
	expectAllAnswer(t, c.GetTCP, added, np, 10, ts.pods)
	if vss, err := framework.IPVS(); err != nil || vss[vs(corev1.ProtocolTCP, ts.VIP, np)] != nil {
		t.Fatalf("node port on the ClusterIP %s (kube-ipvs0) or no ipvsadm (err %v)\n%s", ts.VIP, err, framework.DumpKernel())
	}

	if err := framework.DelAddr("node0", added); err != nil {
		t.Fatal(err)
	}
	waitNoVS(t, nodeAddrTimeout, key)
	waitReals(t, vs(corev1.ProtocolTCP, nodeIP(t), np), reals(ts.pods, 8080))
	expectAllAnswer(t, framework.GetTCP, nodeIP(t), np, 4, ts.pods)
}

// With --nodeport-addresses 10.10.0.0/24, of two addresses added to the
// node only the one inside the range gets the node port. The outside one
// is added first, so the address read that shows the inside one has seen
// both: its missing virtual server is the filter's doing, not a late poll.
func TestNodeAddrNodePortAddresses(t *testing.T) {
	proxyWith(t, "nodeport-addresses", "--nodeport-addresses", "10.10.0.0/24", "--ipvs-sync-period", "1h")
	ts, np := nodePortService(t, "nf")
	const outside, inside = "10.11.0.51", "10.10.0.51"
	addNodeAddr(t, outside)
	addNodeAddr(t, inside)
	insideKey, outsideKey := vs(corev1.ProtocolTCP, inside, np), vs(corev1.ProtocolTCP, outside, np)
	waitRealsWithin(t, nodeAddrTimeout, insideKey, reals(ts.pods, 8080))
	if vss, err := framework.IPVS(); err != nil || vss[outsideKey] != nil {
		t.Fatalf("virtual server %s exists outside --nodeport-addresses (err %v)\n%s", outsideKey, err, framework.DumpKernel())
	}
	expectAllAnswer(t, framework.GetTCP, inside, np, 10, ts.pods)

	if err := framework.DelAddr("node0", inside); err != nil {
		t.Fatal(err)
	}
	waitNoVS(t, nodeAddrTimeout, insideKey)
	waitReals(t, vs(corev1.ProtocolTCP, nodeIP(t), np), reals(ts.pods, 8080))
}
