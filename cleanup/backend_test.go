package cleanup

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/internal/enginetest"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// nftNode is programmedNode after a switch to the nftables backend: the
// iptables backend's chains and sets are still there (the proxy has not
// removed them yet), and the engine programmed a second service through
// the table.
func nftNode(t *testing.T) (*node, *nftrules.Fake) {
	n := programmedNode(t)
	table, err := nftrules.NewFake(nftrules.DefaultConfig(true, false))
	must(t, err)
	_, err = table.Sync()
	must(t, err)
	k := n.Kernel()
	k.IPSet = table.IPSets()
	cfg := sync.Config{NodeName: "node-a", Scheduler: "rr", IPv4: true, NodePortAddresses: nodePorts}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "api"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
			Ports: []v1.ServicePort{{Port: 443, Protocol: v1.ProtocolTCP}}}}
	b := sync.Build(svc, nil, &cfg)
	_, err = enginetest.FullSync(sync.NewReconciler(k, owned.SetNames(true, false), nil), map[string]*sync.ServiceState{"default/api": &b.State})
	must(t, err)
	if !strings.Contains(table.String(), "10.96.0.20 . tcp . 443") {
		t.Fatalf("set-up: the table has no element for the service:\n%s", table)
	}
	return n, table
}

// `ipvsproxy cleanup --rules-backend=nftables`: ownership is read from
// the table; the table goes, and so do the iptables backend's chains and
// ipsets left from before the switch; other software's set and rules stay.
func TestCleanupNFTablesBackend(t *testing.T) {
	n, table := nftNode(t)
	c := n.config()
	c.Kernel.IPSet = table.IPSets()
	c.IPSets = n.IPSet
	c.Table = table
	res, err := Run(c)
	must(t, err)
	if table.String() != "" {
		t.Errorf("nft list table after cleanup:\n%s", table)
	}
	if !res.Table || res.Sets != 17 {
		t.Errorf("result = %+v, want the table and 17 ipsets gone", res)
	}
	if got, want := n.IPSet.String(), "create MY-SET hash:ip family inet hashsize 1024 maxelem 65536\nadd MY-SET 192.0.2.1\n"; got != want {
		t.Errorf("ipset save after cleanup:\n%s\nwant:\n%s", got, want)
	}
	if got := n.ipt.String(); got != n.before {
		t.Errorf("iptables-save after cleanup:\n%s\nwant:\n%s", got, n.before)
	}
	if strings.Contains(n.IPVS.String(), "10.96.0.20") || !strings.Contains(n.IPVS.String(), "192.0.2.10:80") {
		t.Errorf("ipvsadm -Sn after cleanup:\n%s", n.IPVS)
	}
}

// With the iptables backend the nftables table goes too (a node switched
// back from nftables).
func TestCleanupIPTablesBackendDeletesTable(t *testing.T) {
	n, table := nftNode(t)
	c := n.config()
	c.Table = table
	res, err := Run(c)
	must(t, err)
	if table.String() != "" || !res.Table {
		t.Errorf("the table is left (%+v):\n%s", res, table)
	}
	if got := n.ipt.String(); got != n.before {
		t.Errorf("iptables-save after cleanup:\n%s", got)
	}
}

// What the proxy removes when it starts with the nftables backend: the
// iptables chains and the owned ipsets, nothing else (no virtual server,
// no address, no foreign set or rule).
func TestIPTablesBackendLeftovers(t *testing.T) {
	n := programmedNode(t)
	vs, addrs := n.IPVS.String(), n.Dummy.String()
	sets, err := IPTablesBackend([]RuleCleaner{n.rules}, n.IPSet, owned.Sets(true, true))
	must(t, err)
	if sets != 17 {
		t.Errorf("%d sets destroyed, want 17", sets)
	}
	if got, want := n.IPSet.String(), "create MY-SET hash:ip family inet hashsize 1024 maxelem 65536\nadd MY-SET 192.0.2.1\n"; got != want {
		t.Errorf("ipset save:\n%s\nwant:\n%s", got, want)
	}
	if got := n.ipt.String(); got != n.before {
		t.Errorf("iptables-save:\n%s\nwant:\n%s", got, n.before)
	}
	if n.IPVS.String() != vs || n.Dummy.String() != addrs {
		t.Error("the virtual servers or kube-ipvs0 changed")
	}
	// Again on a node without them: nothing to do, no error.
	if sets, err := IPTablesBackend([]RuleCleaner{n.rules}, n.IPSet, owned.Sets(true, true)); err != nil || sets != 0 {
		t.Errorf("second run: %d, %v", sets, err)
	}
}
