//go:build sandbox

// This test runs as root inside the user-mode-Linux sandbox (see
// e2e/sandbox/uml-run) against the real kernel and the iptables backend
// under test (E2E_IPTABLES). It proves, with the operator's own tools, that cleanup removes exactly what
// ipvsproxy made: a hand-made IPVS service, ipset and iptables rules
// survive it.
package cleanup

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/sync"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

func TestSandboxCleanupRemovesOnlyOurs(t *testing.T) {
	// Other software's state, made with the tools.
	sandboxtest.Run(t, "ipvsadm", "-A", "-t", "192.0.2.10:80", "-s", "rr")
	sandboxtest.Run(t, "ipvsadm", "-a", "-t", "192.0.2.10:80", "-r", "10.0.0.1:80", "-m")
	sandboxtest.Run(t, "ipset", "create", "MY-SET", "hash:ip")
	sandboxtest.Run(t, "ipset", "add", "MY-SET", "192.0.2.1")
	sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, ""), "-t", "nat", "-N", "MY-CHAIN")
	sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, ""), "-t", "nat", "-A", "PREROUTING", "-j", "MY-CHAIN")
	sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, ""), "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
	// ipvsproxy also writes the mangle table; a kernel instantiates a table
	// on first use, and so does iptables-save list it.
	sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, ""), "-t", "mangle", "-N", "MY-MANGLE")
	sandboxtest.Run(t, "ip", "link", "add", "eth9", "type", "dummy")
	sandboxtest.Run(t, "ip", "addr", "add", "192.168.1.10/24", "dev", "eth9")
	iptBefore, vsBefore, setsBefore := sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, "save")), sandboxtest.Run(t, "ipvsadm", "-Sn"), sandboxtest.Run(t, "ipset", "list", "-n")

	// ipvsproxy's state, made by its adapters as the proxy makes it.
	h, err := ipvs.New()
	must(t, err)
	defer h.Close()
	dummy, err := dummyif.New(dummyif.DefaultLinkName)
	must(t, err)
	sets, err := ipset.New()
	must(t, err)
	runner, err := iptables.NewExecRunner(iptables.IPv4, iptables.Backend(sandboxtest.IPTablesBackend(t)))
	must(t, err)
	rules, err := iptables.NewSyncer(runner, iptables.DefaultConfig(iptables.IPv4))
	must(t, err)
	k := sync.Kernel{IPVS: h, Dummy: dummy, IPSet: sets}
	must(t, dummy.EnsureLink())
	var names []string
	for _, s := range sync.OwnedSets(true, false) {
		must(t, sets.EnsureSet(s))
		names = append(names, s.Name)
	}
	_, err = rules.Sync()
	must(t, err)
	cfg := sync.Config{NodeName: "node-a", Scheduler: "rr", IPv4: true, NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.1.10")}}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}}}
	b := sync.Build(svc, nil, &cfg)
	res, err := sync.NewReconciler(k, names, nil).FullSync(map[string]*sync.ServiceState{"default/web": &b.State})
	must(t, err)
	if len(res.Failed) > 0 {
		t.Fatal(res.Failed)
	}
	if out := sandboxtest.Run(t, "ipvsadm", "-Sn"); !strings.Contains(out, "-A -t 10.96.0.10:80") || !strings.Contains(out, "-A -t 192.168.1.10:30080") {
		t.Fatalf("set-up did not program the services:\n%s", out)
	}

	got, err := Run(Config{Kernel: k, Sets: sync.OwnedSets(true, true), Rules: []RuleCleaner{rules}, NodePorts: cfg.NodePortAddresses})
	must(t, err)
	if got != (Result{VirtualServers: 2, Addresses: 1, Sets: 17, Link: true}) {
		t.Errorf("result = %+v", got)
	}
	if out := sandboxtest.Run(t, "ipvsadm", "-Sn"); out != vsBefore {
		t.Errorf("ipvsadm -Sn after cleanup:\n%s\nwant:\n%s", out, vsBefore)
	}
	if out := sandboxtest.Run(t, "ipset", "list", "-n"); out != setsBefore {
		t.Errorf("ipset list -n after cleanup:\n%s\nwant:\n%s", out, setsBefore)
	}
	if out := sandboxtest.Run(t, sandboxtest.IPTablesTool(t, false, "save")); iptables.NormalizeSave([]byte(out)) != iptables.NormalizeSave([]byte(iptBefore)) {
		t.Errorf("iptables-save after cleanup:\n%s\nwant:\n%s", out, iptBefore)
	}
	if out, err := exec.Command("ip", "link", "show", dummyif.DefaultLinkName).CombinedOutput(); err == nil {
		t.Errorf("kube-ipvs0 still exists:\n%s", out)
	}
	if out := sandboxtest.Run(t, "ip", "-o", "addr", "show", "dev", "eth9"); !strings.Contains(out, "192.168.1.10/24") {
		t.Errorf("the node's own address went: %s", out)
	}
	// Sanity: what survived is what was made by hand.
	if !strings.Contains(vsBefore, "-A -t 192.0.2.10:80 -s rr") || !strings.Contains(setsBefore, "MY-SET") ||
		!strings.Contains(iptBefore, "-A PREROUTING -j MY-CHAIN") {
		t.Errorf("hand-made state missing before cleanup:\n%s\n%s\n%s", vsBefore, setsBefore, iptBefore)
	}
}
