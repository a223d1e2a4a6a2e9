//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 4, masquerading with real traffic: which connections to a
// ClusterIP reach the backend with the client's own address and which
// with the node's (SNAT), for --masquerade-all and each
// --detect-local-mode. The backends answer GET /peer with the source
// address they saw.
//
// Every mode is checked with a source it calls local and one it does
// not; where possible the two are chosen so that the default mode
// (ClusterCIDR, --cluster-cidr 10.244.0.0/16) would treat them the other
// way round, so a test passes only if its mode is really in force.

// sharedClusterCIDRRule is the nat rule the shared proxy writes:
// ClusterIP traffic from outside --cluster-cidr gets the masquerade mark.
const sharedClusterCIDRRule = "! -s 10.244.0.0/16"

// proxyWith stops the shared proxy and runs one with extra flags instead
// for the rest of the test. When the test ends that one is stopped and the
// shared one started again, and the test waits until the shared proxy has
// put its own masquerade rule back and reports healthy, so the tests that
// follow find the node as they expect.
func proxyWith(t *testing.T, name string, extra ...string) *framework.Proxy {
	t.Helper()
	return proxyAfter(t, name, nil, extra...)
}

// proxyAfter is proxyWith with a step (when not nil) run between stopping
// the shared proxy and starting the other one: a test that needs the node
// in another state first, e.g. cleaned.
func proxyAfter(t *testing.T, name string, before func(), extra ...string) *framework.Proxy {
	t.Helper()
	shared := proxy(t)
	if err := shared.Stop(); err != nil {
		t.Fatal(err)
	}
	p := shared.WithArgs(filepath.Join(results, "ipvsproxy-"+name+".log"), extra...)
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stopping the %s proxy: %v", name, err)
		}
		if err := shared.Start(); err != nil {
			t.Errorf("restarting the shared proxy: %v", err)
			return
		}
		err := framework.Eventually(30*time.Second, 200*time.Millisecond, func() error {
			if code, body, err := framework.Healthz(shared.Healthz); err != nil || code != http.StatusOK {
				return fmt.Errorf("healthz %d %q (%v)", code, body, err)
			}
			return clusterIPMasqRuleIs(sharedClusterCIDRRule)
		})
		if err != nil {
			t.Errorf("the shared proxy after the %s proxy: %v", name, err)
		}
	})
	if before != nil {
		before()
	}
	if err := p.Start(); err != nil {
		t.Fatalf("ipvsproxy %v: %v", extra, err)
	}
	return p
}

// clusterIPMasqRuleIs checks the KUBE-SERVICES rule that marks ClusterIP
// traffic for masquerading: match is what comes before its comment
// ("! -s CIDR", "! -i NAME", or "" for --masquerade-all).
func clusterIPMasqRuleIs(match string) error {
	if framework.NFTables() {
		return nftClusterIPMasqRuleIs(match)
	}
	rules, err := framework.IPTablesNatRules()
	if err != nil {
		return err
	}
	want := strings.TrimSpace("-A KUBE-SERVICES "+match) + " -m comment"
	for _, r := range rules {
		if strings.HasPrefix(r, "-A KUBE-SERVICES ") && strings.Contains(r, "KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ") {
			if !strings.HasPrefix(r, want) {
				return fmt.Errorf("ClusterIP masquerade rule is %q, want it to start with %q", r, want)
			}
			return nil
		}
	}
	return fmt.Errorf("no ClusterIP masquerade rule in KUBE-SERVICES: %v", rules)
}

// nftClusterIPMasqRuleIs is clusterIPMasqRuleIs for the nftables
// backend: the rule of chain services that jumps to mark-for-masquerade
// for @cluster-ip-v4, whose match is the iptables one as nft writes it
// ("! -s CIDR" is "ip saddr != CIDR", "! -i vp+" is `iifname != "vp*"`).
func nftClusterIPMasqRuleIs(match string) error {
	rules, err := framework.NFTRules()
	if err != nil {
		return err
	}
	var prefix string
	switch {
	case strings.HasPrefix(match, "! -s "):
		prefix = "ip saddr != " + strings.TrimPrefix(match, "! -s ") + " "
	case strings.HasPrefix(match, "! -i "):
		name := strings.TrimPrefix(match, "! -i ")
		if n, ok := strings.CutSuffix(name, "+"); ok {
			name = n + "*"
		}
		prefix = `iifname != "` + name + `" `
	case match != "":
		return fmt.Errorf("no nft form of the match %q", match)
	}
	want := "services: " + prefix + "ip daddr . meta l4proto . th dport @cluster-ip-v4 jump mark-for-masquerade"
	for _, r := range rules {
		if strings.HasPrefix(r, "services: ") && strings.HasSuffix(r, "@cluster-ip-v4 jump mark-for-masquerade") {
			if r != want {
				return fmt.Errorf("ClusterIP masquerade rule is %q, want %q", r, want)
			}
			return nil
		}
	}
	return fmt.Errorf("no ClusterIP masquerade rule in chain services: %v", rules)
}

// waitMasqRule waits until the proxy in force has written its masquerade
// rule: the previous proxy's rule stays until then, and traffic sent
// before would test the wrong mode.
func waitMasqRule(t *testing.T, match string) {
	t.Helper()
	waitKernel(t, programTimeout, fmt.Sprintf("ClusterIP masquerade rule %q", match), func() error {
		return clusterIPMasqRuleIs(match)
	})
}

// masqService starts two backends behind a ClusterIP service (port 80 ->
// 8080) and waits until it is programmed.
func masqService(t *testing.T, name string) *testService {
	t.Helper()
	backends := startPods(t, name, 2, []int{8080}, nil)
	ts := createService(t, namespace(t), name, backends, httpPort)
	waitKernel(t, programTimeout, "service "+name, ts.kernelMatches)
	return ts
}

// startPodAt starts a pod with a chosen address (a source for a mode that
// looks at the pod CIDR), stopped when the test ends.
func startPodAt(t *testing.T, name, ip string) *framework.Pod {
	t.Helper()
	p, err := framework.StartPod(name, ip, []int{8080}, nil, results)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// keeps expects the backend to see the client's own address.
func keeps(ip string) func(string) error {
	return func(seen string) error {
		if seen != ip {
			return fmt.Errorf("backend saw %s, want the client's own %s (not masqueraded)", seen, ip)
		}
		return nil
	}
}

// masqueraded expects the backend to see one of the node's addresses
// instead of the client's.
func masqueraded(ip string) func(string) error {
	return func(seen string) error {
		node, err := framework.NodeAddrs("kube-ipvs0")
		if err != nil {
			return err
		}
		if seen == ip || !node[seen] {
			return fmt.Errorf("backend saw %s, want a node address (masqueraded from %s; node has %v)", seen, ip, node)
		}
		return nil
	}
}

// expectSource makes n requests to the service from one source and checks
// that each is answered by one of its backends and what source address
// the backend saw.
func expectSource(t *testing.T, ts *testService, from string, ask framework.AskPeer, n int, check func(string) error) {
	t.Helper()
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		peer, err := ask(ts.VIP, 80)
		if err != nil {
			t.Fatalf("from %s to %s:80: %v\n%s", from, ts.VIP, err, framework.DumpKernel())
		}
		if !slices.ContainsFunc(ts.pods, func(p *framework.Pod) bool { return p.Name == peer.Pod }) {
			t.Fatalf("from %s: answer from %s, which is not a backend of %s", from, peer.Pod, ts.svc.Name)
		}
		if err := check(peer.Addr); err != nil {
			rules, _ := framework.ProxyRules()
			t.Fatalf("from %s to %s:80 (%s): %v\nnat rules:\n%s", from, ts.VIP, peer.Pod, err, strings.Join(rules, "\n"))
		}
		seen[peer.String()]++
	}
	t.Logf("from %s to %s:80: %v", from, ts.VIP, seen)
}

// Default mode (ClusterCIDR, the shared proxy's --cluster-cidr): a pod
// keeps its address, a client outside the cluster CIDR is masqueraded.
func TestMasqueradeClusterCIDR(t *testing.T) {
	proxy(t)
	waitMasqRule(t, sharedClusterCIDRRule)
	ts := masqService(t, "mcc")
	pod := startPods(t, "mcc-src", 1, []int{8080}, nil)[0]
	expectSource(t, ts, "pod "+pod.IP, pod.PeerTCP, 6, keeps(pod.IP))
	out := startClient(t, "mcc-out", "10.20.6.2")
	expectSource(t, ts, "client "+out.IP, out.PeerTCP, 6, masqueraded(out.IP))
}

// --masquerade-all: even a pod inside the cluster CIDR is masqueraded.
func TestMasqueradeAll(t *testing.T) {
	proxyWith(t, "masquerade-all", "--masquerade-all")
	waitMasqRule(t, "")
	ts := masqService(t, "mall")
	pod := startPods(t, "mall-src", 1, []int{8080}, nil)[0]
	expectSource(t, ts, "pod "+pod.IP, pod.PeerTCP, 6, masqueraded(pod.IP))
}

// nodePodCIDR is the sandbox Node's spec.podCIDR for
// --detect-local-mode=NodeCIDR: inside the cluster CIDR and away from the
// addresses framework.NextPodIP hands out.
const nodePodCIDR = "10.244.200.0/24"

// --detect-local-mode=NodeCIDR: the proxy reads the Node's podCIDRs; a pod
// inside them keeps its address, a pod of the cluster CIDR outside them
// (another node's pod, which the default mode would leave alone) is
// masqueraded.
func TestMasqueradeDetectLocalNodeCIDR(t *testing.T) {
	setNodePodCIDR(t, nodePodCIDR)
	proxyWith(t, "nodecidr", "--detect-local-mode", "NodeCIDR")
	waitMasqRule(t, "! -s "+nodePodCIDR)
	ts := masqService(t, "mnc")
	local := startPodAt(t, "mnc-local", "10.244.200.10")
	expectSource(t, ts, "pod "+local.IP+" (node CIDR)", local.PeerTCP, 6, keeps(local.IP))
	other := startPodAt(t, "mnc-other", "10.244.201.10")
	expectSource(t, ts, "pod "+other.IP+" (cluster CIDR, not this node's)", other.PeerTCP, 6, masqueraded(other.IP))
}

// setNodePodCIDR sets spec.podCIDR(s) of the sandbox Node, as the node
// IPAM controller would. The API server allows that once: the value stays
// for the rest of the suite (no other test reads it).
func setNodePodCIDR(t *testing.T, cidr string) {
	t.Helper()
	nodes := cluster.Client.CoreV1().Nodes()
	n, err := nodes.Get(ctx(t), cluster.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	switch n.Spec.PodCIDR {
	case cidr:
		return
	case "":
	default:
		t.Fatalf("node %s already has podCIDR %s (want %s); it cannot change", n.Name, n.Spec.PodCIDR, cidr)
	}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = cidr, []string{cidr}
	if _, err := nodes.Update(ctx(t), n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("setting podCIDR of node %s: %v", n.Name, err)
	}
}

// --detect-local-mode=BridgeInterface: a client on the pod bridge keeps
// its address even outside the cluster CIDR; a pod on a routed veth, in
// the cluster CIDR, is masqueraded (the default mode would do the
// opposite for both).
func TestMasqueradeDetectLocalBridgeInterface(t *testing.T) {
	br, err := framework.StartBridge("e2ebr0", "10.30.0.1/24")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(br.Stop)
	proxyWith(t, "bridge", "--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", br.Name)
	waitMasqRule(t, "! -i "+br.Name)
	ts := masqService(t, "mbr")
	bridged, err := br.StartClient("mbr-bridged", "10.30.0.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bridged.Stop)
	expectSource(t, ts, "bridged client "+bridged.IP, bridged.PeerTCP, 6, keeps(bridged.IP))
	pod := startPods(t, "mbr-veth", 1, []int{8080}, nil)[0]
	expectSource(t, ts, "routed pod "+pod.IP, pod.PeerTCP, 6, masqueraded(pod.IP))
}

// --detect-local-mode=InterfaceNamePrefix with the sandbox pods' root-side
// veth prefix "vp": a pod keeps its address even outside the cluster
// CIDR; a client on a "vc" veth with an address in the cluster CIDR is
// masqueraded (the default mode would do the opposite for both).
func TestMasqueradeDetectLocalInterfaceNamePrefix(t *testing.T) {
	proxyWith(t, "ifprefix", "--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "vp")
	waitMasqRule(t, "! -i vp+")
	ts := masqService(t, "mif")
	pod := startPodAt(t, "mif-pod", "10.31.0.2")
	expectSource(t, ts, "pod "+pod.IP+" (vp veth)", pod.PeerTCP, 6, keeps(pod.IP))
	c := startClient(t, "mif-client", "10.244.202.10")
	expectSource(t, ts, "client "+c.IP+" (vc veth)", c.PeerTCP, 6, masqueraded(c.IP))
}
