package inspect

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/ipvsproxy/ipvsproxy/internal/enginetest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// A node where the proxy has drifted: every kind of difference is printed
// as one ipvsadm/ipset-like line, and foreign objects never appear.
func TestDiffPrintsEveryDifference(t *testing.T) {
	k := newFakeKernel(t)
	svcs := []*v1.Service{service("default", "web", "ClusterIP", "10.96.0.10", 80, 0)}
	eps := []*discovery.EndpointSlice{endpoints("default", "web", 8080, "10.244.1.5", "10.244.1.6")}
	// The kernel: the right VS with the wrong scheduler, one right real
	// server, one draining, one extra; a stale address, VS and set entry;
	// a foreign VS and set that are none of our business.
	web := vsKey("10.96.0.10", ipvs.TCP, 80)
	must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: web, Scheduler: "wrr"}))
	for _, rs := range []ipvs.RealServer{real("10.244.1.5", 8080, 1), real("10.244.1.7", 8080, 0), real("10.244.1.8", 8080, 1)} {
		must(t, k.IPVS.AddRealServer(web, rs))
	}
	stale := vsKey("10.96.0.99", ipvs.UDP, 53)
	must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: stale, Scheduler: "rr"}))
	must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: vsKey("192.0.2.10", ipvs.TCP, 80), Scheduler: "rr"}))
	must(t, k.Dummy.AddAddress(addr("10.96.0.99")))
	must(t, k.IPSet.AddEntry(owned.SetClusterIP, ipset.Entry{IP: addr("10.96.0.10"), Protocol: "tcp", Port: 80}))
	must(t, k.IPSet.AddEntry(owned.SetClusterIP, ipset.Entry{IP: addr("10.96.0.99"), Protocol: "udp", Port: 53}))
	must(t, k.IPSet.EnsureSet(ipset.Set{Name: "FOREIGN", Type: ipset.HashIP, Family: ipset.Inet}))
	must(t, k.IPSet.AddEntry("FOREIGN", ipset.Entry{IP: addr("192.0.2.1")}))
	must(t, k.IPSet.DestroySet(owned.SetHealthCheckNodePort))

	want := BuildDesired(svcs, eps, &testConfig)
	have, err := Read(k.Kernel(), owned.Sets(true, false), nil, nil, want.Wants)
	must(t, err)
	d := Compare(want, have, "kube-ipvs0")
	var out bytes.Buffer
	must(t, d.WriteText(&out))
	const expected = `~ -A -t 10.96.0.10:80 -s rr  (kernel: -A -t 10.96.0.10:80 -s wrr)
+ -a -t 10.96.0.10:80 -r 10.244.1.6:8080 -m -w 1
# -a -t 10.96.0.10:80 -r 10.244.1.7:8080 -m -w 0  (draining)
- -a -t 10.96.0.10:80 -r 10.244.1.8:8080 -m -w 1
- -A -u 10.96.0.99:53 -s rr
+ addr 10.96.0.10 dev kube-ipvs0
- addr 10.96.0.99 dev kube-ipvs0
+ create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
- add KUBE-CLUSTER-IP 10.96.0.99,udp:53
+ add KUBE-IPVS-IPS 10.96.0.10
`
	if out.String() != expected {
		t.Errorf("diff:\n%s\nwant:\n%s", out.String(), expected)
	}
	if d.Equal() {
		t.Error("Equal() = true for a drifted kernel")
	}

	var js struct {
		Equal       bool
		Differences []Line
	}
	out.Reset()
	must(t, d.WriteJSON(&out))
	must(t, json.Unmarshal(out.Bytes(), &js))
	if js.Equal || len(js.Differences) != 10 || js.Differences[0] != (Line{Op: "~", Object: "virtual_server",
		Text: "-A -t 10.96.0.10:80 -s rr", Kernel: "-A -t 10.96.0.10:80 -s wrr"}) {
		t.Errorf("json: %s", out.String())
	}
}

// What the engine programs, diff finds equal: the two agree on desired
// state (same builder) and on ownership, for ClusterIP, NodePort and
// LoadBalancer services. Only draining real servers are listed, as
// comments, and they do not make the states differ.
func TestDiffOfEngineStateIsEqual(t *testing.T) {
	k := newFakeKernel(t)
	lb := service("shop", "front", "LoadBalancer", "10.96.0.20", 443, 30443)
	lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	svcs := []*v1.Service{
		service("default", "web", "ClusterIP", "10.96.0.10", 80, 0),
		service("default", "api", "NodePort", "10.96.0.11", 8080, 30080),
		lb,
	}
	eps := []*discovery.EndpointSlice{
		endpoints("default", "web", 8080, "10.244.1.5", "10.244.1.6"),
		endpoints("default", "api", 9000, "10.244.2.5"),
		endpoints("shop", "front", 8443, "10.244.3.5"),
	}
	want := BuildDesired(svcs, eps, &testConfig)
	states := map[string]*sync.ServiceState{}
	for _, s := range svcs {
		var mine []*sync.ProxySlice
		for _, e := range eps {
			if e.Namespace == s.Namespace && e.Labels[discovery.LabelServiceName] == s.Name {
				mine = append(mine, sync.NewProxySlice(e))
			}
		}
		b := sync.Build(s, mine, &testConfig)
		states[s.Namespace+"/"+s.Name] = &b.State
	}
	var names []string
	for _, s := range owned.Sets(true, false) {
		names = append(names, s.Name)
	}
	rec := sync.NewReconciler(k.Kernel(), names, nil)
	res, err := enginetest.FullSync(rec, states)
	must(t, err)
	if len(res.Failed) > 0 || res.Prune != nil {
		t.Fatalf("engine: %+v", res)
	}
	// A backend the engine is draining stays at weight 0.
	must(t, k.IPVS.AddRealServer(vsKey("10.96.0.10", ipvs.TCP, 80), real("10.244.1.9", 8080, 0)))

	have, err := Read(k.Kernel(), owned.Sets(true, false), nil, nil, want.Wants)
	must(t, err)
	d := Compare(want, have, "kube-ipvs0")
	if !d.Equal() || len(d.Lines) != 1 || d.Lines[0].Op != OpDraining {
		t.Errorf("diff of the engine's own state: %+v", d.Lines)
	}
	if n := len(want.VirtualServers); n != 6 { // web; api ClusterIP+NodePort; front ClusterIP+NodePort+LB
		t.Errorf("desired virtual servers = %d, want 6", n)
	}
}

// Ownership in Read is the engine's: a full pass with no service removes
// exactly the virtual servers Read calls owned.
func TestOwnsMatchesEngine(t *testing.T) {
	k := newFakeKernel(t)
	exclude := []netip.Prefix{netip.MustParsePrefix("10.96.100.0/24")}
	keys := []ipvs.ServiceKey{
		vsKey("10.96.0.10", ipvs.TCP, 80),       // address on kube-ipvs0
		vsKey("10.96.100.5", ipvs.TCP, 80),      // on kube-ipvs0 but excluded
		vsKey("198.51.100.1", ipvs.TCP, 443),    // external IP in KUBE-EXTERNAL-IP
		vsKey("192.168.1.10", ipvs.TCP, 30080),  // node port in the bitmap
		vsKey("192.168.1.10", ipvs.UDP, 30080),  // same port, UDP bitmap has none
		vsKey("192.168.1.10", ipvs.SCTP, 30090), // SCTP node port hash
		vsKey("192.0.2.10", ipvs.TCP, 80),       // hand-made
		vsKey("192.0.2.20", ipvs.TCP, 30080),    // hand-made, node-port number, not a node-port address
	}
	nodePorts := []netip.Addr{addr("192.168.1.10")}
	for _, key := range keys {
		must(t, k.IPVS.AddVirtualServer(ipvs.VirtualServer{ServiceKey: key, Scheduler: "rr"}))
	}
	must(t, k.Dummy.AddAddress(addr("10.96.0.10")))
	must(t, k.Dummy.AddAddress(addr("10.96.100.5")))
	must(t, k.IPSet.AddEntry(owned.SetExternalIP, ipset.Entry{IP: addr("198.51.100.1"), Protocol: "tcp", Port: 443}))
	must(t, k.IPSet.AddEntry(owned.SetNodePortTCP, ipset.Entry{Port: 30080}))
	must(t, k.IPSet.AddEntry(owned.SetNodePortSCTP, ipset.Entry{IP: addr("192.168.1.10"), Protocol: "sctp", Port: 30090}))

	have, err := Read(k.Kernel(), owned.Sets(true, false), exclude, nodePorts, nil)
	must(t, err)
	var ownedKeys, notOwned []ipvs.ServiceKey
	for _, kv := range have.VirtualServers {
		if kv.Owned {
			ownedKeys = append(ownedKeys, kv.VS.ServiceKey)
		} else {
			notOwned = append(notOwned, kv.VS.ServiceKey)
		}
	}
	if len(ownedKeys) != 4 {
		t.Errorf("owned = %v, want 4", ownedKeys)
	}
	var names []string
	for _, s := range owned.Sets(true, false) {
		names = append(names, s.Name)
	}
	rec := sync.NewReconciler(k.Kernel(), names, exclude)
	rec.SetNodePortAddresses(nodePorts)
	if _, err := enginetest.FullSync(rec, map[string]*sync.ServiceState{}); err != nil {
		t.Fatal(err)
	}
	left, err := k.IPVS.ListVirtualServers()
	must(t, err)
	var survivors []ipvs.ServiceKey
	for _, v := range left {
		survivors = append(survivors, v.ServiceKey)
	}
	slices.SortFunc(survivors, ipvs.CompareServiceKeys)
	if !slices.Equal(survivors, notOwned) {
		t.Errorf("engine kept %v; inspect calls not owned %v", survivors, notOwned)
	}
}

// Drift of the fixed iptables rules follows the kernel objects' lines,
// one iptables command each, and makes the states differ.
func TestDiffPrintsRuleDrift(t *testing.T) {
	f := iptables.NewFakeRunner(iptables.IPv4)
	names := []string{}
	for _, s := range owned.Sets(true, false) {
		names = append(names, s.Name)
	}
	f.SetKnownSets(names...)
	s, err := iptables.NewSyncer(f, iptables.DefaultConfig(iptables.IPv4))
	must(t, err)
	_, err = s.Sync()
	must(t, err)
	must(t, f.DeleteRule(iptables.TableNAT, iptables.ChainServices, "-s 127.0.0.0/8 -j RETURN"))
	must(t, f.Apply("*filter\n-A KUBE-FORWARD -j ACCEPT\nCOMMIT\n"))
	must(t, f.DeleteChain(iptables.TableMangle, iptables.ChainCanary))
	drift, err := s.Drift()
	must(t, err)
	d := Diff{Lines: []Line{{Op: OpMissing, Object: "address", Text: "addr 10.96.0.10 dev kube-ipvs0"}}}
	d.Lines = append(d.Lines, RuleLines(drift)...)
	var out bytes.Buffer
	must(t, d.WriteText(&out))
	const expected = `+ addr 10.96.0.10 dev kube-ipvs0
+ -t nat -A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
- -t filter -A KUBE-FORWARD -j ACCEPT
+ -t mangle -N KUBE-PROXY-CANARY
`
	if out.String() != expected {
		t.Errorf("diff:\n%s\nwant:\n%s", out.String(), expected)
	}
	if got := RuleLines([]iptables.Drift{{Op: iptables.DriftOrder, Rule: "-t nat -S KUBE-SERVICES"}}); len(got) != 1 ||
		got[0].String() != "~ -t nat -S KUBE-SERVICES  (kernel: the same rules in another order)" || got[0].Object != "iptables" {
		t.Errorf("order drift: %v", got)
	}
	if !(Diff{Lines: RuleLines(nil)}).Equal() {
		t.Error("no drift, yet not Equal")
	}
}

// The nftables table's drift is listed as the iptables rules' is: one
// line per chain, set or table, in text and JSON; none is equal.
func TestTableLines(t *testing.T) {
	table, err := nftrules.NewFake(nftrules.DefaultConfig(true, false))
	must(t, err)
	_, err = table.Sync()
	must(t, err)
	must(t, table.FlushChain("services"))
	drift, err := table.Drift()
	must(t, err)
	d := Diff{Lines: append(TableLines(drift),
		TableLines([]nftrules.Drift{{Op: nftrules.DriftExtra, Object: "chain inet ipvsproxy foreign"}, {Op: nftrules.DriftMissing, Object: "table inet ipvsproxy"}})...)}
	var out bytes.Buffer
	must(t, d.WriteText(&out))
	const expected = `~ chain inet ipvsproxy services  (kernel: 0 rules, want 7)
- chain inet ipvsproxy foreign
+ table inet ipvsproxy
`
	if out.String() != expected || d.Equal() {
		t.Errorf("diff (equal %t):\n%s\nwant:\n%s", d.Equal(), out.String(), expected)
	}
	if d.Lines[0].Object != "nftables" {
		t.Errorf("object %q, want nftables", d.Lines[0].Object)
	}
	if !(Diff{Lines: TableLines(nil)}).Equal() {
		t.Error("no drift, yet not Equal")
	}
}
