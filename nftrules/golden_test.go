package nftrules

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

var update = flag.Bool("update", false, "rewrite testdata/*.nft from the fake (review the diff!)")

// The full `nft list table inet ipvsproxy` text of representative
// configurations, each with elements in every kind of set, is in
// testdata/NAME.nft. The sandbox test proves the real nft prints the
// fake's text for the same writes.

func mustIf(t *testing.T, name string, prefix bool) iptables.InterfaceName {
	t.Helper()
	parse := iptables.ParseInterfaceName
	if prefix {
		parse = iptables.ParseInterfaceNamePrefix
	}
	n, err := parse(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func goldenConfigs(t *testing.T) map[string]Config {
	v4, v6, dual := DefaultConfig(true, false), DefaultConfig(false, true), DefaultConfig(true, true)
	cidr4, cidr6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")
	out := map[string]Config{"ipv4-no-cluster-cidr": v4}

	c := v6
	c.LocalDetector.ClusterCIDRs = []netip.Prefix{cidr6}
	c.MasqueradeBit, c.RandomFully = 31, true
	out["ipv6-cluster-cidr-bit31-random-fully"] = c

	c = dual
	c.LocalDetector = iptables.LocalDetector{Mode: iptables.LocalModeNodeCIDR,
		NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	out["dual-stack-node-cidr"] = c

	c = v4
	c.LocalDetector = iptables.LocalDetector{Mode: iptables.LocalModeClusterCIDR, ClusterCIDRs: []netip.Prefix{cidr4}}
	out["ipv4-cluster-cidr"] = c

	c = v4
	c.LocalDetector = iptables.LocalDetector{Mode: iptables.LocalModeBridgeInterface, BridgeInterface: mustIf(t, "cbr0", false)}
	out["ipv4-bridge-interface"] = c

	c = dual
	c.LocalDetector = iptables.LocalDetector{Mode: iptables.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: mustIf(t, "veth", true)}
	out["dual-stack-interface-name-prefix"] = c

	c = v4
	c.LocalDetector.ClusterCIDRs = []netip.Prefix{cidr4}
	c.MasqueradeAll = true
	out["ipv4-masquerade-all"] = c
	return out
}

// sampleEntries are entries for every ipset of one family, enough of
// them to show how nft wraps each kind of element list.
func sampleEntries(v6 bool) map[string][]ipset.Entry {
	a := func(v4s, v6s string) netip.Addr {
		if v6 {
			return netip.MustParseAddr(v6s)
		}
		return netip.MustParseAddr(v4s)
	}
	p := func(v4s, v6s string) netip.Prefix {
		if v6 {
			return netip.MustParsePrefix(v6s)
		}
		return netip.MustParsePrefix(v4s)
	}
	vip := a("10.96.0.10", "fd00:10:96::a")
	ep := a("10.244.1.5", "fd00:10:244:1::5")
	lb := a("192.0.2.10", "2001:db8::10")
	ext := a("198.51.100.7", "2001:db8:1::7")
	node := a("172.18.0.2", "fc00:f853:ccd:e793::2")
	name := func(base string) string { return owned.SetName(base, v6) }
	return map[string][]ipset.Entry{
		name(owned.SetLoopBack): {{IP: ep, Protocol: "tcp", Port: 8080, IP2: ep}},
		name(owned.SetClusterIP): {{IP: vip, Protocol: "udp", Port: 53}, {IP: vip, Protocol: "tcp", Port: 53},
			{IP: a("10.96.0.1", "fd00:10:96::1"), Protocol: "tcp", Port: 443}},
		name(owned.SetExternalIP):        {{IP: ext, Protocol: "tcp", Port: 80}},
		name(owned.SetExternalIPLocal):   {{IP: ext, Protocol: "tcp", Port: 8443}},
		name(owned.SetLoadBalancer):      {{IP: lb, Protocol: "tcp", Port: 443}},
		name(owned.SetLoadBalancerLocal): {{IP: lb, Protocol: "tcp", Port: 443}},
		name(owned.SetLoadBalancerFW):    {{IP: lb, Protocol: "tcp", Port: 443}},
		name(owned.SetLoadBalancerSrcIP): {{IP: lb, Protocol: "tcp", Port: 443, IP2: lb}},
		// Two ranges, the higher first: nft lists an interval set in the
		// kernel's order, which for ranges of a concatenation is the
		// order they were added in.
		name(owned.SetLoadBalancerSrcCIDR): {{IP: lb, Protocol: "tcp", Port: 443, Net: p("203.0.113.0/24", "2001:db8:2::/48")},
			{IP: lb, Protocol: "tcp", Port: 443, Net: p("198.51.100.0/24", "2001:db8:1::/48")}},
		name(owned.SetNodePortTCP):         {{Port: 30080}, {Port: 30443}},
		name(owned.SetNodePortUDP):         {{Port: 30053}},
		name(owned.SetNodePortLocalTCP):    {{Port: 30443}},
		name(owned.SetNodePortSCTP):        {{IP: node, Protocol: "sctp", Port: 30900}},
		name(owned.SetNodePortLocalSCTP):   {{IP: node, Protocol: "sctp", Port: 30901}},
		name(owned.SetHealthCheckNodePort): {{Port: 32000}, {Port: 32001}, {Port: 32002}, {Port: 32003}, {Port: 32004}, {Port: 32005}},
		name(owned.SetIPVSIPs):             {{IP: vip}, {IP: a("10.96.0.1", "fd00:10:96::1")}, {IP: lb}},
	}
}

func TestGoldenTables(t *testing.T) {
	for name, cfg := range goldenConfigs(t) {
		t.Run(name, func(t *testing.T) {
			f, err := NewFake(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			for _, v6 := range cfg.families() {
				for set, entries := range sampleEntries(v6) {
					if err := f.AddElements(set, entries...); err != nil {
						t.Fatal(err)
					}
				}
			}
			path := filepath.Join("testdata", name+".nft")
			if *update {
				if err := os.WriteFile(path, []byte(f.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), f.String()); diff != "" {
				t.Errorf("nft list table (-want +got):\n%s", diff)
			}
		})
	}
}
