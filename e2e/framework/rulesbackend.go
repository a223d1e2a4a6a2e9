//go:build e2e

package framework

import (
	"fmt"
	"os"
	"strings"
)

// The rules backend under test, and how a test reads what it wrote: the
// ipsets and iptables-save, or the nftables table with the real nft.

// The --rules-backend values.
const (
	BackendIPTables = "iptables"
	BackendNFTables = "nftables"
)

// NFTTable is the nftables backend's table (family inet).
const NFTTable = "ipvsproxy"

// RulesBackend is the --rules-backend the suite runs the proxy with:
// E2E_RULES_BACKEND, iptables (the default) or nftables.
func RulesBackend() string {
	switch b := os.Getenv("E2E_RULES_BACKEND"); b {
	case "", BackendIPTables:
		return BackendIPTables
	case BackendNFTables:
		return BackendNFTables
	default:
		panic(fmt.Sprintf("E2E_RULES_BACKEND=%q: want iptables or nftables", b))
	}
}

// NFTables reports whether the suite runs with the nftables backend.
func NFTables() bool { return RulesBackend() == BackendNFTables }

// OtherBackend is the rules backend the suite does not run with.
func OtherBackend() string {
	if NFTables() {
		return BackendIPTables
	}
	return BackendNFTables
}

// nftSet is the nft set that stands in for one of kube-proxy's ipsets,
// and for the TCP/UDP node-port bitmaps the protocol their elements
// carry. Written from docs/architecture.md's table, not from the proxy's
// code, so a test fails when the two disagree.
type nftSet struct{ name, proto string }

var nftSets = map[string]nftSet{
	"KUBE-LOOP-BACK":                 {"loop-back", ""},
	"KUBE-CLUSTER-IP":                {"cluster-ip", ""},
	"KUBE-EXTERNAL-IP":               {"external-ip", ""},
	"KUBE-EXTERNAL-IP-LOCAL":         {"external-ip-local", ""},
	"KUBE-LOAD-BALANCER":             {"load-balancer", ""},
	"KUBE-LOAD-BALANCER-LOCAL":       {"load-balancer-local", ""},
	"KUBE-LOAD-BALANCER-FW":          {"load-balancer-fw", ""},
	"KUBE-LOAD-BALANCER-SOURCE-IP":   {"load-balancer-source-ip", ""},
	"KUBE-LOAD-BALANCER-SOURCE-CIDR": {"load-balancer-source-cidr", ""},
	"KUBE-NODE-PORT-TCP":             {"node-port", "tcp"},
	"KUBE-NODE-PORT-UDP":             {"node-port", "udp"},
	"KUBE-NODE-PORT-LOCAL-TCP":       {"node-port-local", "tcp"},
	"KUBE-NODE-PORT-LOCAL-UDP":       {"node-port-local", "udp"},
	"KUBE-NODE-PORT-SCTP-HASH":       {"node-port-sctp", ""},
	"KUBE-NODE-PORT-LOCAL-SCTP-HASH": {"node-port-local-sctp", ""},
	"KUBE-HEALTH-CHECK-NODE-PORT":    {"health-check-node-port", ""},
	"KUBE-IPVS-IPS":                  {"ipvs-ips", ""},
}

// nftSetFor returns the nft set for an ipset name (KUBE-6-… is IPv6's
// twin); ok is false for a set ipvsproxy does not own.
func nftSetFor(ipset string) (nftSet, bool) {
	suffix := "-v4"
	if rest, ok := strings.CutPrefix(ipset, "KUBE-6-"); ok {
		ipset, suffix = "KUBE-"+rest, "-v6"
	}
	s, ok := nftSets[ipset]
	s.name += suffix
	return s, ok
}

// SetMembersIn is SetMembers in the given backend: with nftables, an
// ipset name ipvsproxy owns is read from its nft set (`nft list set`),
// each element written as `ipset save` writes the entry; a missing set or
// table is an error, as a missing ipset is.
func SetMembersIn(backend, set string) (map[string]bool, error) {
	s, ours := nftSetFor(set)
	if backend != BackendNFTables || !ours {
		return ipsetMembers(set)
	}
	out, err := Run("nft", "list", "set", "inet", NFTTable, s.name)
	if err != nil {
		return nil, err
	}
	members := map[string]bool{}
	for _, el := range nftElements(out) {
		if m, ok := ipsetForm(el, s.proto); ok {
			members[m] = true
		}
	}
	return members, nil
}

// nftElements are the elements of a `nft list set` listing: between
// "elements = {" and "}", separated by commas, possibly over lines.
func nftElements(listing string) []string {
	_, rest, ok := strings.Cut(listing, "elements = {")
	if !ok {
		return nil
	}
	rest, _, _ = strings.Cut(rest, "}")
	var out []string
	for _, el := range strings.Split(rest, ",") {
		if el = strings.TrimSpace(el); el != "" {
			out = append(out, el)
		}
	}
	return out
}

// ipsetForm writes an nft element as `ipset save` writes the entry:
// "A . tcp . 80" is "A,tcp:80", "A . tcp . 80 . B" is "A,tcp:80,B", a
// node-port element "tcp . 30080" is "30080" in the TCP set only (proto),
// an address or a port is itself.
func ipsetForm(el, proto string) (string, bool) {
	f := strings.Split(el, " . ")
	switch len(f) {
	case 1:
		return f[0], true
	case 2:
		return f[1], f[0] == proto
	case 3:
		return f[0] + "," + f[1] + ":" + f[2], true
	case 4:
		return f[0] + "," + f[1] + ":" + f[2] + "," + f[3], true
	}
	return "", false
}

// NFTRules are the rules of table inet ipvsproxy, each as "CHAIN: RULE"
// as nft lists it; none when there is no table.
func NFTRules() ([]string, error) {
	if ok, err := NFTTableExists(); err != nil || !ok {
		return nil, err
	}
	out, err := Run("nft", "list", "table", "inet", NFTTable)
	if err != nil {
		return nil, err
	}
	var rules []string
	chain := ""
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "\tchain "):
			chain = strings.TrimSuffix(strings.TrimPrefix(l, "\tchain "), " {")
		case strings.HasPrefix(l, "\t}"):
			chain = ""
		case chain != "" && strings.HasPrefix(l, "\t\t") && !strings.Contains(l, " hook "):
			rules = append(rules, chain+": "+strings.TrimSpace(l))
		}
	}
	return rules, nil
}

// NFTTableExists reports whether table inet ipvsproxy exists.
func NFTTableExists() (bool, error) {
	out, err := Run("nft", "list", "tables")
	if err != nil {
		return false, err
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == "table inet "+NFTTable {
			return true, nil
		}
	}
	return false, nil
}

// ProxyRules are ipvsproxy's rules in the backend under test: the nat
// table's KUBE- rules (IPTablesNatRules) or the table's (NFTRules).
func ProxyRules() ([]string, error) { return ProxyRulesIn(RulesBackend()) }

// ProxyRulesIn is ProxyRules of the given backend.
func ProxyRulesIn(backend string) ([]string, error) {
	if backend == BackendNFTables {
		return NFTRules()
	}
	return IPTablesNatRules()
}

// BackendLeftovers describes what of the given backend is on the node
// ("" for nothing): for iptables any KUBE- chain in iptables-save or
// ip6tables-save (no kubelet runs in the sandbox, so every one is
// ipvsproxy's) and any KUBE- ipset; for nftables the table.
func BackendLeftovers(backend string) (string, error) {
	var left []string
	if backend == BackendNFTables {
		ok, err := NFTTableExists()
		if err != nil {
			return "", err
		}
		if ok {
			left = append(left, "table inet "+NFTTable)
		}
		return strings.Join(left, "; "), nil
	}
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		save, err := Run(tool)
		if err != nil {
			return "", err
		}
		for _, l := range strings.Split(save, "\n") {
			if strings.HasPrefix(l, ":KUBE-") {
				left = append(left, tool+" chain "+strings.Fields(l)[0][1:])
			}
		}
	}
	sets, err := Run("ipset", "list", "-n")
	if err != nil {
		return "", err
	}
	for _, s := range strings.Fields(sets) {
		if strings.HasPrefix(s, "KUBE-") {
			left = append(left, "ipset "+s)
		}
	}
	return strings.Join(left, "; "), nil
}
