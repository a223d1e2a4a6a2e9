package nftrules

import (
	"fmt"

	"github.com/google/nftables"

	"github.com/ipvsproxy/ipvsproxy/iptables"
)

// TableName is the one table ipvsproxy owns whole, family inet: both
// address families' rules and sets live in it.
const TableName = "ipvsproxy"

// Chain names. Base chains are named after their hook; the others after
// the kube-proxy chain they replace (KUBE-SERVICES → services, …).
const (
	chainNATPrerouting   = "nat-prerouting"
	chainNATOutput       = "nat-output"
	chainNATPostrouting  = "nat-postrouting"
	chainFilterInput     = "filter-input"
	chainFilterForward   = "filter-forward"
	chainMangleOutput    = "mangle-output"
	chainServices        = "services"               // KUBE-SERVICES
	chainPostrouting     = "postrouting"            // KUBE-POSTROUTING
	chainNodePort        = "node-port"              // nat KUBE-NODE-PORT
	chainLoadBalancer    = "load-balancer"          // KUBE-LOAD-BALANCER
	chainMarkMasq        = "mark-for-masquerade"    // KUBE-MARK-MASQ
	chainProxyFirewall   = "proxy-firewall"         // KUBE-PROXY-FIREWALL
	chainSourceRangesFW  = "source-ranges-firewall" // KUBE-SOURCE-RANGES-FIREWALL
	chainIPVSFilter      = "ipvs-filter"            // KUBE-IPVS-FILTER
	defaultMasqueradeBit = iptables.DefaultMasqueradeBit
)

// Config is what the table depends on; the fields mean what the
// iptables backend's iptables.Config fields of the same names mean.
type Config struct {
	// IPv4 and IPv6 choose the families the table serves (at least one).
	IPv4, IPv6 bool
	// MasqueradeBit (0-31) is the fwmark bit that asks for masquerading.
	MasqueradeBit int
	MasqueradeAll bool
	LocalDetector iptables.LocalDetector
	// RandomFully masquerades with fully-random port selection.
	RandomFully bool
}

// DefaultConfig is kube-proxy's defaults for the chosen families.
func DefaultConfig(v4, v6 bool) Config {
	return Config{IPv4: v4, IPv6: v6, MasqueradeBit: defaultMasqueradeBit}
}

// Validate reports the first problem with c. The local-traffic detector
// is checked by the iptables backend's own rules, so both backends
// accept exactly the same settings.
func (c Config) Validate() error {
	if !c.IPv4 && !c.IPv6 {
		return fmt.Errorf("nftrules: no address family enabled")
	}
	for _, f := range c.families() {
		ic := iptables.Config{Family: iptables.IPv4, MasqueradeBit: c.MasqueradeBit, LocalDetector: c.LocalDetector}
		if f {
			ic.Family = iptables.IPv6
		}
		if err := ic.Validate(); err != nil {
			return fmt.Errorf("nftrules: %w", err)
		}
	}
	return nil
}

// families lists the enabled families as "is IPv6", IPv4 first.
func (c Config) families() []bool {
	var out []bool
	if c.IPv4 {
		out = append(out, false)
	}
	if c.IPv6 {
		out = append(out, true)
	}
	return out
}

// hookSpec makes a chain a base chain.
type hookSpec struct {
	typ  nftables.ChainType
	hook *nftables.ChainHook
	prio *nftables.ChainPriority
	// hookName and prioName are how nft 1.0.6 (Debian 12) prints them.
	// nft 1.0.8 and later print the nat output priority as "dstnat".
	hookName, prioName string
	// drop: policy drop, only in the fake's listing of a chain someone
	// else changed; ipvsproxy's chains accept.
	drop bool
}

func (h *hookSpec) text() string {
	policy := "accept"
	if h.drop {
		policy = "drop"
	}
	return fmt.Sprintf("type %s hook %s priority %s; policy %s;", h.typ, h.hookName, h.prioName, policy)
}

// The hooks, at the priorities of the iptables tables they stand in for,
// so the order against IPVS's own hooks is the same: nat OUTPUT (-100)
// and mangle OUTPUT (-150) run before IPVS takes a node's connection at
// LOCAL_OUT (-99), filter INPUT (0) before IPVS's LOCAL_IN (98).
var (
	hookNATPrerouting  = &hookSpec{nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, "prerouting", "dstnat", false}
	hookNATOutput      = &hookSpec{nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest, "output", "-100", false}
	hookNATPostrouting = &hookSpec{nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource, "postrouting", "srcnat", false}
	hookFilterInput    = &hookSpec{nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter, "input", "filter", false}
	hookFilterForward  = &hookSpec{nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, "forward", "filter", false}
	hookMangleOutput   = &hookSpec{nftables.ChainTypeRoute, nftables.ChainHookOutput, nftables.ChainPriorityMangle, "output", "mangle", false}
)

// chainSpec is one chain and its complete rule list.
type chainSpec struct {
	name  string
	hook  *hookSpec // nil for a regular chain
	rules []rule
}

// tableSpec is the whole table's structure: what one transaction writes.
type tableSpec struct {
	sets   []*setSpec
	chains []chainSpec
}

func (t tableSpec) set(name string) *setSpec {
	for _, s := range t.sets {
		if s.name == name {
			return s
		}
	}
	return nil
}
