package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// healthy is a node as ipvsproxy leaves it.
func healthy(t *testing.T) (Node, *sysctl.Fake, *ipset.Fake, *dummyif.Fake) {
	t.Helper()
	sc := sysctl.NewFake(map[string]string{
		"net/ipv4/ip_forward": "1", "net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
		"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/vs/conn_reuse_mode": "1",
		"net/netfilter/nf_conntrack_count": "1000", "net/netfilter/nf_conntrack_max": "131072",
		"net/ipv4/conf/all/arp_ignore": "0", "net/ipv4/conf/all/arp_announce": "0",
	})
	sets := ipset.NewFake()
	for _, s := range []ipset.Set{{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort, Family: ipset.Inet},
		{Name: "KUBE-LOAD-BALANCER", Type: ipset.HashIPPort, Family: ipset.Inet}} {
		if err := sets.EnsureSet(s); err != nil {
			t.Fatal(err)
		}
	}
	d := dummyif.NewFake("")
	if err := d.EnsureLink(); err != nil {
		t.Fatal(err)
	}
	if err := d.AddAddress(netip.MustParseAddr("10.96.0.1")); err != nil {
		t.Fatal(err)
	}
	links := map[string]bool{}
	return Node{
		KernelRelease: "6.12.3-amd64",
		Module:        func(string) bool { return true },
		LinkExists:    func(name string) bool { return links[name] },
		Sysctl:        sc, Sets: sets, Dummy: d,
		Backend:   func() (string, error) { return "nft", nil },
		Save:      func(string, string) ([]byte, error) { return nil, errors.New("not installed") },
		Scheduler: "rr",
		OwnedSet:  func(name string) bool { return strings.HasPrefix(name, "KUBE-") },
	}, sc, sets, d
}

func find(checks []Check, name string) Check {
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	return Check{}
}

// TestHealthyNode: a node as ipvsproxy leaves it has nothing to report.
func TestHealthyNode(t *testing.T) {
	n, _, _, _ := healthy(t)
	checks := Run(n)
	if w := Worst(checks); w != OK {
		var b bytes.Buffer
		_ = WriteText(&b, checks)
		t.Errorf("worst %s:\n%s", w, b.String())
	}
	if c := find(checks, "kube-ipvs0"); c.Detail != "1 addresses (1 IPv4, 0 IPv6)" {
		t.Errorf("kube-ipvs0: %+v", c)
	}
}

// TestProblemsFound: each problem is named, with what to do.
func TestProblemsFound(t *testing.T) {
	n, sc, sets, _ := healthy(t)
	n.Module = func(m string) bool { return m != "ip_vs_rr" }
	sc.Values["net/ipv4/vs/conn_reuse_mode"] = "0"
	sc.Values["net/ipv4/vs/conntrack"] = "0"
	sc.Values["net/netfilter/nf_conntrack_count"] = "125000"
	if err := sets.AddEntry("KUBE-LOAD-BALANCER", ipset.Entry{IP: netip.MustParseAddr("203.0.113.7"), Protocol: "tcp", Port: 80}); err != nil {
		t.Fatal(err)
	}
	if err := sets.EnsureSet(ipset.Set{Name: "kube-router-svip", Type: ipset.HashIP, Family: ipset.Inet}); err != nil {
		t.Fatal(err)
	}
	n.LinkExists = func(name string) bool { return name == "kube-dummy-if" }
	n.Backend = func() (string, error) { return "", errors.New("no iptables-save on the PATH") }
	checks := Run(n)
	n.Backend = func() (string, error) { return "nft", nil }
	n.Save = func(backend, table string) ([]byte, error) {
		switch {
		case backend == "legacy" && table == "filter":
			return []byte("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp --dport 22 -j ACCEPT\n-A INPUT -j KUBE-FIREWALL\nCOMMIT\n"), nil
		case backend == "nft" && table == "nat":
			return []byte("*nat\n:KUBE-SVC-ABC - [0:0]\n:KUBE-SEP-DEF - [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"), nil
		}
		return nil, nil
	}
	checks = append(checks, Run(n)...)
	for _, want := range []struct {
		name   string
		status Status
		says   string
	}{
		{"kernel modules", Fail, "not loaded: ip_vs_rr"},
		{"net/ipv4/vs/conn_reuse_mode", Warn, "set it to 1"},
		{"net/ipv4/vs/conntrack", Fail, "0, want 1"},
		{"conntrack table", Fail, "125000 of 131072 entries (95%): nearly full"},
		{"strict ARP", Warn, "1 load-balancer IP entries"},
		{"kube-router leftovers", Warn, "link kube-dummy-if, ipset kube-router-svip"},
		{"iptables backend", Fail, "no iptables-save"},
		{"iptables legacy", Warn, "1 rules of other programs in the legacy backend"},
		{"kube-proxy leftovers", Warn, "2 KUBE-SVC/SEP/SVL/EXT chains"},
	} {
		c := find(checks, want.name)
		if c.Status != want.status || !strings.Contains(c.Detail, want.says) {
			t.Errorf("%s: %+v, want %s saying %q", want.name, c, want.status, want.says)
		}
	}
	if Worst(checks) != Fail {
		t.Errorf("worst %s, want fail", Worst(checks))
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, checks); err != nil {
		t.Fatal(err)
	}
	var back []Check
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back) != len(checks) {
		t.Errorf("JSON round trip: %v, %d of %d", err, len(back), len(checks))
	}
}

// TestSetNearMaxElem: a set at 90 % of its maxelem is reported (it will
// be grown); the kube-ipvs0 link missing means ipvsproxy has not run.
func TestSetNearMaxElem(t *testing.T) {
	n, _, sets, _ := healthy(t)
	n.Dummy = dummyif.NewFake("")
	if err := sets.EnsureSet(ipset.Set{Name: "KUBE-EXTERNAL-IP", Type: ipset.HashIPPort, Family: ipset.Inet, MaxElem: 10}); err != nil {
		t.Fatal(err)
	}
	for i := range 9 {
		if err := sets.AddEntry("KUBE-EXTERNAL-IP", ipset.Entry{IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Protocol: "tcp", Port: 80}); err != nil {
			t.Fatal(err)
		}
	}
	checks := Run(n)
	if c := find(checks, "ipset KUBE-EXTERNAL-IP"); c.Status != Warn || !strings.Contains(c.Detail, "9 of maxelem 10") {
		t.Errorf("near-full set: %+v", c)
	}
	if c := find(checks, "kube-ipvs0"); c.Status != Warn || !strings.Contains(c.Detail, "has not run") {
		t.Errorf("missing link: %+v", c)
	}
}

// TestNoIPSetModule: without ip_set the checks still run, and say so.
func TestNoIPSetModule(t *testing.T) {
	n, _, _, _ := healthy(t)
	n.Sets, n.SetsErr = nil, errors.New("ip_set: protocol not supported")
	if c := find(Run(n), "ipsets"); c.Status != Fail || !strings.Contains(c.Detail, "protocol not supported") {
		t.Errorf("ipsets: %+v", c)
	}
}

// With --rules-backend=nftables: a kernel without inet nf_tables fails
// one check with one line; nf_tables replaces ip_set among the modules;
// the iptables checks are not made (the node may have no iptables).
func TestNFTablesBackend(t *testing.T) {
	n, _, _, _ := healthy(t)
	n.Backend = func() (string, error) { return "", errors.New("no iptables") }
	loaded := map[string]bool{"ip_vs": true, "ip_vs_rr": true, "nf_tables": true, "nf_conntrack": true, "dummy": true}
	n.Module = func(m string) bool { return loaded[m] }
	unsupported := errors.New("nftrules: this kernel's nf_tables cannot hold an inet table (operation not supported)")
	n.NFTables = func() error { return unsupported }
	checks := Run(n)
	if c := find(checks, "nftables"); c.Status != Fail || c.Detail != unsupported.Error() {
		t.Errorf("nftables check: %+v", c)
	}
	if c := find(checks, "kernel modules"); c.Status != OK || !strings.Contains(c.Detail, "nf_tables") {
		t.Errorf("modules: %+v", c)
	}
	if c := find(checks, "iptables backend"); c != (Check{}) {
		t.Errorf("iptables checked with the nftables backend: %+v", c)
	}
	n.NFTables = func() error { return nil }
	if c := find(Run(n), "nftables"); c.Status != OK {
		t.Errorf("nftables check on a capable kernel: %+v", c)
	}
	var text bytes.Buffer
	n.NFTables = func() error { return unsupported }
	if err := WriteText(&text, Run(n)); err != nil || strings.Count(text.String(), "nftables") != 1 {
		t.Errorf("text: %v\n%s", err, text.String())
	}
}
