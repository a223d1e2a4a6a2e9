package iptables

import (
	"fmt"
	"regexp"

	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Table names ipvsproxy writes to.
const (
	TableNAT    = "nat"
	TableFilter = "filter"
	TableMangle = "mangle"
)

// Chain names. They are kube-proxy's (IPVS mode) so that an operator
// migrating from it finds the same names in iptables-save, and so that
// a node handed over from kube-proxy is adopted rather than duplicated.
const (
	ChainServices     = "KUBE-SERVICES"      // nat, from PREROUTING and OUTPUT
	ChainPostrouting  = "KUBE-POSTROUTING"   // nat, from POSTROUTING
	ChainMarkMasq     = "KUBE-MARK-MASQ"     // nat, sets the masquerade bit
	ChainNodePort     = "KUBE-NODE-PORT"     // nat: node-port masquerading; filter: health-check ports, from INPUT
	ChainLoadBalancer = "KUBE-LOAD-BALANCER" // nat, LB masquerading
	ChainForward      = "KUBE-FORWARD"       // filter, from FORWARD

	ChainProxyFirewall        = "KUBE-PROXY-FIREWALL"         // filter, from INPUT and FORWARD; mangle, from OUTPUT
	ChainSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL" // filter and mangle, loadBalancerSourceRanges
	ChainIPVSFilter           = "KUBE-IPVS-FILTER"            // filter, from INPUT: host-port protection
	ChainIPVSOutFilter        = "KUBE-IPVS-OUT-FILTER"        // filter, from OUTPUT

	// ChainCanary is an empty chain in every table ipvsproxy writes to,
	// named like kube-proxy's (iptables/nftables modes) firewall-reload
	// canary: a firewalld reload or "iptables -X" removes it, telling the
	// Monitor that the rules were wiped (see canary.go).
	ChainCanary = "KUBE-PROXY-CANARY"
)

// DefaultMasqueradeBit is kube-proxy's --iptables-masquerade-bit default:
// mark 0x4000.
const DefaultMasqueradeBit = 14

// Config is what the rules depend on. Build it with DefaultConfig and
// change fields; every field is validated before any rule text is made,
// so no unchecked string reaches iptables-restore.
type Config struct {
	// Family must match the SaveRestorer's family.
	Family Family
	// MasqueradeBit (0-31) is the fwmark bit that asks KUBE-POSTROUTING to
	// masquerade. Taken literally (0 is a valid bit, as in kube-proxy):
	// DefaultConfig sets 14.
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to ClusterIPs.
	MasqueradeAll bool
	// LocalDetector decides which ClusterIP traffic is masqueraded when
	// MasqueradeAll is off (--detect-local-mode). When it cannot tell
	// (no CIDR of this family) it does what kube-proxy does after
	// logging a warning: it only masquerades traffic whose source is
	// itself a service VIP (node-originated connections that picked a
	// kube-ipvs0 address as source), matched as KUBE-CLUSTER-IP src,dst.
	LocalDetector LocalDetector
	// RandomFully adds --random-fully to MASQUERADE. Set it from
	// SupportsRandomFully(runner): iptables older than 1.6.2 rejects it.
	RandomFully bool
	// ClusterIPSet and LoopBackSet name the ipsets the ClusterIP and
	// hairpin rules match on. Empty means owned.SetName(owned.SetClusterIP|owned.SetLoopBack,
	// Family). Every other set has its kube-proxy name (owned.SetName of
	// the owned.Set* constants), the name the engine creates it under.
	ClusterIPSet string
	LoopBackSet  string
}

// DefaultConfig returns kube-proxy's defaults for family.
func DefaultConfig(family Family) Config {
	return Config{
		Family:        family,
		MasqueradeBit: DefaultMasqueradeBit,
		ClusterIPSet:  owned.SetName(owned.SetClusterIP, family == IPv6),
		LoopBackSet:   owned.SetName(owned.SetLoopBack, family == IPv6),
	}
}

// set returns the name of the set base for c's family, honouring the two
// configurable names.
func (c Config) set(base string) string {
	switch {
	case base == owned.SetClusterIP && c.ClusterIPSet != "":
		return c.ClusterIPSet
	case base == owned.SetLoopBack && c.LoopBackSet != "":
		return c.LoopBackSet
	}
	return owned.SetName(base, c.Family == IPv6)
}

// setNameRE is deliberately narrower than what ipset allows: names end up
// as iptables-restore words.
var setNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,30}$`)

// withDefaults fills empty set names.
func (c Config) withDefaults() Config {
	if c.ClusterIPSet == "" {
		c.ClusterIPSet = owned.SetName(owned.SetClusterIP, c.Family == IPv6)
	}
	if c.LoopBackSet == "" {
		c.LoopBackSet = owned.SetName(owned.SetLoopBack, c.Family == IPv6)
	}
	return c
}

// Validate reports the first problem with c (after filling defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.Family != IPv4 && c.Family != IPv6 {
		return fmt.Errorf("iptables: invalid family %d", c.Family)
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("iptables: masquerade bit %d not in [0, 31]", c.MasqueradeBit)
	}
	for _, n := range []string{c.ClusterIPSet, c.LoopBackSet} {
		if !setNameRE.MatchString(n) {
			return fmt.Errorf("iptables: invalid ipset name %q", n)
		}
	}
	_, err := c.LocalDetector.notLocal(c.Family)
	return err
}

// Warnings lists what an operator should hear about c at start-up; the
// caller logs them (kube-proxy warns the same way when the cluster CIDR
// or the node's pod CIDR is unset).
func (c Config) Warnings() []string {
	if c.MasqueradeAll {
		return nil
	}
	if m, err := c.LocalDetector.notLocal(c.Family); err == nil && m == nil {
		what := "cluster CIDR"
		if c.LocalDetector.Mode == LocalModeNodeCIDR {
			what = "pod CIDR on this node"
		}
		return []string{fmt.Sprintf("no IPv%d %s (--detect-local-mode=%s): cannot tell off-cluster traffic to ClusterIPs, "+
			"only traffic sourced from a service VIP is masqueraded", c.Family, what, c.LocalDetector.mode())}
	}
	return nil
}
