package cleanup

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/enginetest"
	"github.com/ipvsproxy/ipvsproxy/internal/fakenode"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// foreignRules is other software's state in the tables ipvsproxy writes.
const foreignRules = `*nat
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A DOCKER -i docker0 -j RETURN
COMMIT
*filter
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
*mangle
-A POSTROUTING -o eth0 -p udp -m udp --dport 4789 -j MARK --set-xmark 0x10/0x10
COMMIT
`

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type node struct {
	*fakenode.Node
	ipt    *iptables.FakeRunner
	rules  *iptables.Syncer
	before string // iptables-save before ipvsproxy ran
}

// nodePorts are the addresses the programmed node serves node ports on.
var nodePorts = []netip.Addr{netip.MustParseAddr("192.168.1.10")}

// config is what `ipvsproxy cleanup` runs with on the programmed node.
func (n *node) config(exclude ...netip.Prefix) Config {
	return Config{Kernel: n.Kernel(), Sets: owned.Sets(true, true), Rules: []RuleCleaner{n.rules}, Exclude: exclude, NodePorts: nodePorts}
}

// programmedNode is a node where other software made a VS, a set and
// rules, and then ipvsproxy ran as it does: link, sets, rules, services.
func programmedNode(t *testing.T) *node {
	n := &node{Node: fakenode.New(t, true, false), ipt: iptables.NewFakeRunner(iptables.IPv4)}
	foreignVS := ipvs.ServiceKey{Address: netip.MustParseAddr("192.0.2.10"), Protocol: ipvs.TCP, Port: 80}
	must(t, n.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: foreignVS, Scheduler: "rr"}))
	must(t, n.IPVS.AddRealServer(foreignVS, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr("10.0.0.1"), Port: 80}, Weight: 1}))
	must(t, n.IPSet.EnsureSet(ipset.Set{Name: "MY-SET", Type: ipset.HashIP, Family: ipset.Inet}))
	must(t, n.IPSet.AddEntry("MY-SET", ipset.Entry{IP: netip.MustParseAddr("192.0.2.1")}))
	must(t, n.ipt.Apply(foreignRules))
	n.before = n.ipt.String()

	var err error
	n.rules, err = iptables.NewSyncer(n.ipt, iptables.DefaultConfig(iptables.IPv4))
	must(t, err)
	names := owned.SetNames(true, false)
	_, err = n.rules.Sync()
	must(t, err)
	cfg := sync.Config{NodeName: "node-a", Scheduler: "rr", IPv4: true, NodePortAddresses: nodePorts}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			ExternalIPs: []string{"198.51.100.1"},
			Ports:       []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}}}
	b := sync.Build(svc, nil, &cfg)
	res, err := enginetest.FullSync(sync.NewReconciler(n.Kernel(), names, nil), map[string]*sync.ServiceState{"default/web": &b.State})
	must(t, err)
	if len(res.Failed) > 0 {
		t.Fatal(res.Failed)
	}
	if got := strings.Count(n.IPVS.String(), "-A "); got != 4 { // ClusterIP, external IP, node port, foreign
		t.Fatalf("set-up: %d virtual servers:\n%s", got, n.IPVS)
	}
	return n
}

func TestCleanupRemovesOnlyWhatIsOwned(t *testing.T) {
	n := programmedNode(t)
	c := n.config()
	res, err := Run(c)
	must(t, err)
	if res != (Result{VirtualServers: 3, Addresses: 2, Sets: 17, Link: true}) {
		t.Errorf("result = %+v", res)
	}
	if got, want := n.IPVS.String(), "-A -t 192.0.2.10:80 -s rr\n-a -t 192.0.2.10:80 -r 10.0.0.1:80 -m -w 1\n"; got != want {
		t.Errorf("ipvsadm -Sn after cleanup:\n%s\nwant:\n%s", got, want)
	}
	if got, want := n.IPSet.String(), "create MY-SET hash:ip family inet hashsize 1024 maxelem 65536\nadd MY-SET 192.0.2.1\n"; got != want {
		t.Errorf("ipset save after cleanup:\n%s\nwant:\n%s", got, want)
	}
	if got := n.ipt.String(); got != n.before {
		t.Errorf("iptables-save after cleanup:\n%s\nwant what was there before ipvsproxy:\n%s", got, n.before)
	}
	if got := n.Dummy.String(); got != "Device \"kube-ipvs0\" does not exist.\n" {
		t.Errorf("ip addr: %s", got)
	}

	// A second run on the clean node removes nothing and does not fail.
	res, err = Run(c)
	must(t, err)
	if res != (Result{}) {
		t.Errorf("second run: %+v", res)
	}
}

// A VS in --ipvs-exclude-cidrs is never ours to remove, even with its
// address on kube-ipvs0.
func TestCleanupKeepsExcluded(t *testing.T) {
	n := programmedNode(t)
	must(t, n.Dummy.AddAddress(netip.MustParseAddr("10.96.100.5")))
	kept := ipvs.ServiceKey{Address: netip.MustParseAddr("10.96.100.5"), Protocol: ipvs.TCP, Port: 80}
	must(t, n.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: kept, Scheduler: "rr"}))
	_, err := Run(n.config(netip.MustParsePrefix("10.96.100.0/24")))
	must(t, err)
	if got, want := n.IPVS.String(), "-A -t 10.96.100.5:80 -s rr\n-A -t 192.0.2.10:80 -s rr\n-a -t 192.0.2.10:80 -r 10.0.0.1:80 -m -w 1\n"; got != want {
		t.Errorf("ipvsadm -Sn after cleanup:\n%s\nwant:\n%s", got, want)
	}
}

// When the kernel cannot be read, nothing is removed: ownership is unknown.
// When one step fails, the later steps still run and the error says why.
func TestCleanupFailures(t *testing.T) {
	n := programmedNode(t)
	vsBefore, setsBefore := n.IPVS.String(), n.IPSet.String()
	undo := n.Dummy.FailOn(dummyif.VerbListAddresses, nil, errors.New("netlink: boom"))
	c := n.config()
	if _, err := Run(c); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err = %v", err)
	}
	if n.IPVS.String() != vsBefore || n.IPSet.String() != setsBefore || n.ipt.String() == n.before {
		t.Error("a failed read removed something")
	}

	undo()
	n.ipt.FailOn(iptables.VerbRestore, nil, errors.New("xtables lock"))
	res, err := Run(c)
	if err == nil || !strings.Contains(err.Error(), "xtables lock") {
		t.Fatalf("err = %v", err)
	}
	if res.VirtualServers != 3 || !res.Link {
		t.Errorf("later steps did not run: %+v", res)
	}
}

// A virtual server someone else made on a node-port number, on an address
// ipvsproxy does not serve node ports on, is not ipvsproxy's (issue #16,
// item 5); the node port it made on 192.168.1.10 is.
func TestCleanupKeepsForeignVSOnNodePortNumber(t *testing.T) {
	n := programmedNode(t)
	foreign := ipvs.ServiceKey{Address: netip.MustParseAddr("192.0.2.20"), Protocol: ipvs.TCP, Port: 30080}
	must(t, n.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: foreign, Scheduler: "wrr"}))
	res, err := Run(n.config())
	must(t, err)
	if got, want := n.IPVS.String(), "-A -t 192.0.2.10:80 -s rr\n-a -t 192.0.2.10:80 -r 10.0.0.1:80 -m -w 1\n-A -t 192.0.2.20:30080 -s wrr\n"; got != want {
		t.Errorf("ipvsadm -Sn after cleanup:\n%s\nwant:\n%s", got, want)
	}
	if res.VirtualServers != 3 {
		t.Errorf("removed %d virtual servers, want 3 (ClusterIP, external IP, node port)", res.VirtualServers)
	}
}

// The address of an excluded virtual server is foreign: cleanup removes
// ipvsproxy's addresses from kube-ipvs0 and keeps the link for it
// (issue #16, item 6).
func TestCleanupKeepsExcludedAddressAndLink(t *testing.T) {
	n := programmedNode(t)
	must(t, n.Dummy.AddAddress(netip.MustParseAddr("10.96.100.5")))
	res, err := Run(n.config(netip.MustParsePrefix("10.96.100.0/24")))
	must(t, err)
	if got := n.Dummy.Addresses(); len(got) != 1 || got[0] != netip.MustParseAddr("10.96.100.5") {
		t.Errorf("kube-ipvs0 addresses after cleanup: %v, want only the excluded 10.96.100.5\n%s", got, n.Dummy)
	}
	if res.Link {
		t.Error("cleanup reports the link deleted though a foreign address is on it")
	}
}

// With iptables-nft the kernel frees a removed rule's set match after the
// restore returns (from a work queue), so a set can still be in use for a
// moment: cleanup retries it and destroys it. A set another program's rule
// keeps using is reported once the wait is over, and the rest still goes.
func TestCleanupWaitsForSetReferences(t *testing.T) {
	defer func(w time.Duration) { setInUseWait = w }(setInUseWait)
	setInUseWait = 300 * time.Millisecond
	n := programmedNode(t)
	refs := map[string]int{owned.SetClusterIP: 2, owned.SetLoopBack: 1 << 30} // destroys refused
	n.IPSet.FailOn(ipset.VerbDestroySet, func(c ipset.Call) bool {
		if refs[c.Set] > 0 {
			refs[c.Set]--
			return true
		}
		return false
	}, ipset.ErrSetInUse)
	res, err := Run(n.config())
	if err == nil || !strings.Contains(err.Error(), "destroy set "+owned.SetLoopBack+": ") || strings.Contains(err.Error(), owned.SetClusterIP) {
		t.Fatalf("err = %v; want only %s still in use", err, owned.SetLoopBack)
	}
	if res.Sets != 16 {
		t.Errorf("destroyed %d sets, want 16 (all but %s)", res.Sets, owned.SetLoopBack)
	}
	if got := n.IPSet.String(); strings.Contains(got, owned.SetClusterIP) || !strings.Contains(got, "create "+owned.SetLoopBack+" ") {
		t.Errorf("ipset save after cleanup:\n%s", got)
	}
}
