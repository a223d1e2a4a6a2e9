package iptables

import (
	"github.com/ipvsproxy/ipvsproxy/owned"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseInterfaceName(t *testing.T) {
	for _, ok := range []string{"cbr0", "eth0.100", "br-0123456789ab", "cni_0", "veth@x"} {
		if n, err := ParseInterfaceName(ok); err != nil || n.String() != ok || !n.IsSet() {
			t.Errorf("ParseInterfaceName(%q) = %v, %v", ok, n, err)
		}
	}
	for _, bad := range []string{"", "0123456789abcdef", ".", "..", "a/b", "a b", "a\tb", "a:b", "-i", "!x",
		"veth+", `a"b`, "a'b", `a\b`, "bré0", "a\x00"} {
		if _, err := ParseInterfaceName(bad); err == nil {
			t.Errorf("ParseInterfaceName(%q) accepted", bad)
		}
	}
	// A prefix gets '+' appended, so it must leave room for it.
	if _, err := ParseInterfaceNamePrefix("0123456789abcd"); err != nil {
		t.Error(err)
	}
	if _, err := ParseInterfaceNamePrefix("0123456789abcde"); err == nil {
		t.Error("ParseInterfaceNamePrefix accepted 15 bytes")
	}
	if (InterfaceName{}).IsSet() {
		t.Error("zero InterfaceName is set")
	}
}

func TestParseLocalMode(t *testing.T) {
	for in, want := range map[string]LocalMode{"": LocalModeClusterCIDR, "ClusterCIDR": LocalModeClusterCIDR,
		"NodeCIDR": LocalModeNodeCIDR, "BridgeInterface": LocalModeBridgeInterface, "InterfaceNamePrefix": LocalModeInterfaceNamePrefix} {
		if got, err := ParseLocalMode(in); err != nil || got != want {
			t.Errorf("ParseLocalMode(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"clustercidr", "None", "BridgeInterface "} {
		if _, err := ParseLocalMode(bad); err == nil {
			t.Errorf("ParseLocalMode(%q) accepted", bad)
		}
	}
}

func TestLocalDetectorValidation(t *testing.T) {
	p := netip.MustParsePrefix
	bad := map[string]LocalDetector{
		"unknown mode":             {Mode: "Magic"},
		"bridge without name":      {Mode: LocalModeBridgeInterface},
		"prefix without prefix":    {Mode: LocalModeInterfaceNamePrefix},
		"bridge name too long":     {Mode: LocalModeBridgeInterface, BridgeInterface: InterfaceName{"0123456789abcdef"}},
		"prefix name too long":     {Mode: LocalModeInterfaceNamePrefix, InterfaceNamePrefix: InterfaceName{"0123456789abcde"}},
		"two v4 node CIDRs":        {Mode: LocalModeNodeCIDR, NodeCIDRs: []netip.Prefix{p("10.0.1.0/24"), p("10.0.2.0/24")}},
		"invalid node CIDR":        {Mode: LocalModeNodeCIDR, NodeCIDRs: []netip.Prefix{{}}},
		"invalid cluster CIDR":     {ClusterCIDRs: []netip.Prefix{{}}},
		"two v4 cluster CIDRs":     {ClusterCIDRs: []netip.Prefix{p("10.0.0.0/8"), p("192.168.0.0/16")}},
		"injected name via struct": {Mode: LocalModeBridgeInterface, BridgeInterface: InterfaceName{"x -j ACCEPT"}},
	}
	for name, d := range bad {
		c := DefaultConfig(IPv4)
		c.LocalDetector = d
		if _, err := NewSyncer(NewFakeRunner(c.Family), c); err == nil {
			t.Errorf("%s: NewSyncer accepted %+v", name, d)
		}
	}
	// Fields of other modes are ignored: a stale bad CIDR list does not
	// matter in BridgeInterface mode.
	c := DefaultConfig(IPv4)
	c.LocalDetector = LocalDetector{Mode: LocalModeBridgeInterface, BridgeInterface: mustIfName(ParseInterfaceName, "cbr0"),
		ClusterCIDRs: []netip.Prefix{p("10.0.0.0/8"), p("192.168.0.0/16")}}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}

func TestNodeCIDRWarning(t *testing.T) {
	c := DefaultConfig(IPv6)
	// Only an IPv4 pod CIDR on this node: the IPv6 syncer cannot tell.
	c.LocalDetector = LocalDetector{Mode: LocalModeNodeCIDR, NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}}
	w := c.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "no IPv6 pod CIDR on this node (--detect-local-mode=NodeCIDR)") {
		t.Errorf("Warnings = %q", w)
	}
	f := NewFakeRunner(IPv6)
	if _, err := mustSyncer(t, f, c).Sync(); err != nil {
		t.Fatal(err)
	}
	if got := mustSave(t, f, TableNAT); !strings.Contains(got, "--match-set KUBE-6-CLUSTER-IP src,dst -j KUBE-MARK-MASQ") {
		t.Errorf("no-detector fallback rule missing:\n%s", got)
	}
}

// TestRulesMatchExactlyOwnedSets holds the rules and the engine's set
// list together: every set a rule names is created by the engine, and
// every set the engine creates is used by some rule.
func TestRulesMatchExactlyOwnedSets(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		var used []string
		for _, tbl := range DefaultConfig(fam).wanted() {
			for _, ch := range tbl.chains {
				for _, r := range ch.rules {
					if i := slices.Index(r, "--match-set"); i >= 0 {
						used = append(used, r[i+1])
					}
				}
			}
		}
		slices.Sort(used)
		used = slices.Compact(used)
		ownedNames := owned.SetNames(fam == IPv4, fam == IPv6)
		slices.Sort(ownedNames)
		if !slices.Equal(used, ownedNames) {
			t.Errorf("IPv%d: rules use %q\nengine owns %q", fam, used, ownedNames)
		}
	}
}
