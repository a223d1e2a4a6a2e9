package cleanup

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/enginetest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// The ownership matrix: every way ipvsproxy removes things (a Service
// deleted, the full pass's prune after a restart, `ipvsproxy cleanup`)
// against every kind of foreign object a node may hold next to it. Each
// foreign object must look the same to the operator's tools before
// ipvsproxy ran and after the removal. The table runs on the fakes here
// and on the real kernel in the sandbox (matrix_sandbox_test.go).

// matrixNode is a node the matrix runs on: the fakes, or the real kernel.
type matrixNode struct {
	k     owned.Kernel
	ipt   iptables.SaveRestorer
	rules *iptables.Syncer
	// view is what the operator's tools print: ipvsadm -Sn, ipset save,
	// iptables-save and ip -o addr.
	view func(t *testing.T) string
}

var (
	matrixExclude   = []netip.Prefix{netip.MustParsePrefix("10.96.100.0/24")}
	matrixNodePorts = []netip.Addr{netip.MustParseAddr("192.168.1.10")}
	matrixConfig    = sync.Config{NodeName: "node-a", Scheduler: "rr", IPv4: true, NodePortAddresses: matrixNodePorts, ExcludeCIDRs: matrixExclude}
)

// foreignObject is something another program made on the node.
type foreignObject struct {
	name string
	// marker is in every line the tools print about the object, and in
	// no line about ipvsproxy's own objects.
	marker string
	make   func(t *testing.T, n *matrixNode)
	// externalIP, when set, is given to the Service, so that it reaches
	// the object.
	externalIP string
}

var foreignObjects = []foreignObject{
	{name: "excluded VS with its address on kube-ipvs0", marker: "10.96.100.5", make: func(t *testing.T, n *matrixNode) {
		must(t, n.k.Dummy.AddAddress(netip.MustParseAddr("10.96.100.5")))
		addForeignVS(t, n, "10.96.100.5", 80, "10.0.0.5")
	}},
	{name: "foreign VS on a node-port number, not on a node-port address", marker: "192.0.2.20", make: func(t *testing.T, n *matrixNode) {
		addForeignVS(t, n, "192.0.2.20", 30080, "10.0.0.20")
	}},
	{name: "hand-made VS reached through an externalIP", marker: "10.96.100.7", externalIP: "10.96.100.7",
		make: func(t *testing.T, n *matrixNode) { addForeignVS(t, n, "10.96.100.7", 80, "10.0.0.7") }},
	{name: "foreign ipset", marker: "MY-SET", make: func(t *testing.T, n *matrixNode) {
		must(t, n.k.IPSet.EnsureSet(ipset.Set{Name: "MY-SET", Type: ipset.HashIP, Family: ipset.Inet, HashSize: 1024, MaxElem: 65536}))
		must(t, n.k.IPSet.AddEntry("MY-SET", ipset.Entry{IP: netip.MustParseAddr("192.0.2.1")}))
	}},
	{name: "foreign iptables chain", marker: "MY-CHAIN", make: func(t *testing.T, n *matrixNode) {
		must(t, n.ipt.Restore([]byte("*nat\n:MY-CHAIN - [0:0]\n-A PREROUTING -j MY-CHAIN\n-A MY-CHAIN -p tcp -m tcp --dport 30080 -j RETURN\nCOMMIT\n")))
	}},
}

func addForeignVS(t *testing.T, n *matrixNode, addr string, port uint16, real string) {
	t.Helper()
	k := ipvs.ServiceKey{Address: netip.MustParseAddr(addr), Protocol: ipvs.TCP, Port: port}
	must(t, n.k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: k, Scheduler: "wlc"}))
	must(t, n.k.IPVS.AddRealServer(k, ipvs.RealServer{RealKey: ipvs.RealKey{Address: netip.MustParseAddr(real), Port: 80}, Weight: 3}))
}

// removalPath programs the Service web with one ipvsproxy and then
// removes it by one of the three paths.
type removalPath struct {
	name string
	run  func(t *testing.T, n *matrixNode, web *sync.ServiceState)
}

const webKey = "default/web"

var removalPaths = []removalPath{
	{"incremental delete of the Service", func(t *testing.T, n *matrixNode, web *sync.ServiceState) {
		rec := matrixReconciler(n)
		must(t, rec.Sync(webKey, web))
		assertProgrammed(t, n)
		must(t, rec.Sync(webKey, nil))
	}},
	{"full-pass prune after a restart", func(t *testing.T, n *matrixNode, web *sync.ServiceState) {
		fullSync(t, matrixReconciler(n), map[string]*sync.ServiceState{webKey: web})
		assertProgrammed(t, n)
		// The Service is deleted while ipvsproxy is down; the new process
		// prepares the node and runs its first pass with no service.
		_, err := n.rules.Sync()
		must(t, err)
		fullSync(t, matrixReconciler(n), map[string]*sync.ServiceState{})
	}},
	{"ipvsproxy cleanup", func(t *testing.T, n *matrixNode, web *sync.ServiceState) {
		fullSync(t, matrixReconciler(n), map[string]*sync.ServiceState{webKey: web})
		assertProgrammed(t, n)
		_, err := Run(Config{Kernel: n.k, Sets: owned.Sets(true, false), Rules: []RuleCleaner{n.rules},
			Exclude: matrixExclude, NodePorts: matrixNodePorts})
		must(t, err)
	}},
}

func matrixReconciler(n *matrixNode) *sync.Reconciler {
	var names []string
	for _, s := range owned.Sets(true, false) {
		names = append(names, s.Name)
	}
	rec := sync.NewReconciler(n.k, names, matrixExclude)
	rec.SetNodePortAddresses(matrixNodePorts)
	return rec
}

func fullSync(t *testing.T, rec *sync.Reconciler, want map[string]*sync.ServiceState) {
	t.Helper()
	res, err := enginetest.FullSync(rec, want)
	must(t, err)
	if len(res.Failed) > 0 || res.Prune != nil {
		t.Fatalf("full sync: failed %v, prune %v", res.Failed, res.Prune)
	}
}

// webService is a NodePort Service: ClusterIP 10.96.0.10:80, node port
// 30080 (on 192.168.1.10), with one endpoint, and externalIP if given.
func webService(externalIP string) *sync.ServiceState {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}}}
	if externalIP != "" {
		svc.Spec.ExternalIPs = []string{externalIP}
	}
	b := sync.Build(svc, nil, &matrixConfig)
	return &b.State
}

// ipvsproxy's own objects, as the tools print them.
var ownLines = []string{"10.96.0.10", "192.168.1.10:30080"}

func assertProgrammed(t *testing.T, n *matrixNode) {
	t.Helper()
	v := n.view(t)
	for _, s := range ownLines {
		if !strings.Contains(v, s) {
			t.Fatalf("ipvsproxy did not program %s:\n%s", s, v)
		}
	}
}

// linesWith returns the lines of text that contain marker.
func linesWith(text, marker string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, marker) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// runMatrix runs the removal paths against every foreign object on the
// nodes newNode makes (a fresh one per case, after ipvsproxy's node
// set-up: link, sets, fixed rules).
func runMatrix(t *testing.T, newNode func(t *testing.T) *matrixNode, paths []removalPath) {
	for _, path := range paths {
		for _, obj := range foreignObjects {
			t.Run(path.name+"/"+obj.name, func(t *testing.T) {
				n := newNode(t)
				obj.make(t, n)
				before := linesWith(n.view(t), obj.marker)
				if before == "" {
					t.Fatalf("the tools do not show the %s", obj.name)
				}
				path.run(t, n, webService(obj.externalIP))
				after := n.view(t)
				if got := linesWith(after, obj.marker); got != before {
					t.Errorf("%s changed:\n--- before ipvsproxy ---\n%s--- after %s ---\n%s", obj.name, before, path.name, got)
				}
				for _, s := range ownLines {
					if strings.Contains(after, s) {
						t.Errorf("ipvsproxy's %s is still there after %s:\n%s", s, path.name, linesWith(after, s))
					}
				}
			})
		}
	}
}

// fakeMatrixNode is the fakes after ipvsproxy's node set-up.
func fakeMatrixNode(t *testing.T) *matrixNode {
	iv, d, s, ipt := ipvs.NewFake(), dummyif.NewFake(""), ipset.NewFake(), iptables.NewFakeRunner(iptables.IPv4)
	n := &matrixNode{k: owned.Kernel{IPVS: iv, Dummy: d, IPSet: s}, ipt: ipt,
		view: func(*testing.T) string { return iv.String() + s.String() + ipt.String() + d.String() }}
	prepareNode(t, n)
	return n
}

// prepareNode does what the proxy does before its first sync: the link,
// the owned sets, the fixed rules.
func prepareNode(t *testing.T, n *matrixNode) {
	t.Helper()
	var err error
	n.rules, err = iptables.NewSyncer(n.ipt, iptables.DefaultConfig(iptables.IPv4))
	must(t, err)
	must(t, n.k.Dummy.EnsureLink())
	for _, s := range owned.Sets(true, false) {
		must(t, n.k.IPSet.EnsureSet(s))
	}
	_, err = n.rules.Sync()
	must(t, err)
}

func TestOwnershipMatrix(t *testing.T) { runMatrix(t, fakeMatrixNode, removalPaths) }
