package iptables

import (
	"fmt"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// Comments as kube-proxy writes them; operators grep for these. The set
// comments are kube-proxy's ipset comments, which it also puts on the
// rules matching each set.
const (
	commentServicePortals   = "kubernetes service portals"
	commentPostrouting      = "kubernetes postrouting rules"
	commentForward          = "kubernetes forwarding rules"
	commentForwardConntrack = "kubernetes forwarding conntrack rule"
	commentHealthCheck      = "kubernetes health check rules"
	commentProxyFirewall    = "kube-proxy firewall rules"
	commentIPVSFilter       = "kubernetes ipvs access filter"
	commentSNAT             = "kubernetes service traffic requiring SNAT"

	commentClusterIPSet     = "Kubernetes service cluster ip + port for masquerade purpose"
	commentLoopBackSet      = "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"
	commentExternalIPSet    = "Kubernetes service external ip + port for masquerade and filter purpose"
	commentExternalIPLocal  = "Kubernetes service external ip + port with externalTrafficPolicy=local"
	commentLoadBalancerSet  = "Kubernetes service lb portal"
	commentLBLocalSet       = "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
	commentLBFWSet          = "Kubernetes service load balancer ip + port for load balancer with sourceRange"
	commentLBSourceIPSet    = "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
	commentLBSourceCIDRSet  = "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
	commentNodePortTCP      = "Kubernetes nodeport TCP port for masquerade purpose"
	commentNodePortLocalTCP = "Kubernetes nodeport TCP port with externalTrafficPolicy=local"
	commentNodePortUDP      = "Kubernetes nodeport UDP port for masquerade purpose"
	commentNodePortLocalUDP = "Kubernetes nodeport UDP port with externalTrafficPolicy=local"
	commentNodePortSCTP     = "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"
	commentNodePortLocalSCT = "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"
	commentHealthCheckSet   = "Kubernetes health check node port"
)

// mark returns the masquerade mark value, e.g. "0x4000".
func (c Config) mark() string { return fmt.Sprintf("%#x", uint32(1)<<c.MasqueradeBit) }

// natTable is kube-proxy's nat table for IPVS mode. Every rule is always
// written (kube-proxy leaves out rules whose set is empty): a rule on an
// empty set costs one lookup, and a fixed rule set means a service change
// never spawns iptables-restore.
func (c Config) natTable() tableSpec {
	return tableSpec{
		name: TableNAT,
		chains: []chainSpec{
			{ChainServices, c.servicesRules()},
			{ChainPostrouting, c.postroutingRules()},
			{ChainNodePort, c.nodePortRules()},
			{ChainLoadBalancer, c.loadBalancerRules()},
			{ChainMarkMasq, [][]string{{"-j", "MARK", "--set-xmark", c.mark() + "/" + c.mark()}}},
			{ChainCanary, nil},
		},
		jumps: []jumpSpec{
			{"OUTPUT", jumpRule(commentServicePortals, ChainServices)},
			{"PREROUTING", jumpRule(commentServicePortals, ChainServices)},
			{"POSTROUTING", jumpRule(commentPostrouting, ChainPostrouting)},
		},
	}
}

func jumpRule(comment, to string) []string {
	return []string{"-m", "comment", "--comment", comment, "-j", to}
}

// setMatch is "-m comment --comment COMMENT -m set --match-set SET DIR",
// the shape of kube-proxy's per-set rules.
func setMatch(comment, set, dir string) []string {
	return []string{"-m", "comment", "--comment", comment, "-m", "set", "--match-set", set, dir}
}

// servicesRules is KUBE-SERVICES, in kube-proxy's order: leave localhost
// alone; send LB traffic to KUBE-LOAD-BALANCER; decide masquerading for
// ClusterIP and external-IP traffic; send everything addressed to the
// node to KUBE-NODE-PORT; finally accept service traffic so other
// software's rules further down PREROUTING/OUTPUT cannot break IPVS.
func (c Config) servicesRules() [][]string {
	loopback := "127.0.0.0/8"
	if c.Family == IPv6 {
		loopback = "::1/128"
	}
	// Connections to localhost never reach IPVS; leave them alone early.
	rules := [][]string{
		{"-s", loopback, "-j", "RETURN"},
		concat(setMatch(commentLoadBalancerSet, c.set(owned.SetLoadBalancer), "dst,dst"), "-j", ChainLoadBalancer),
		c.clusterIPMasqRule(),
	}
	rules = append(rules, c.externalIPRules()...)
	return append(rules,
		// Node ports: the bitmap/hash sets in KUBE-NODE-PORT only see
		// traffic addressed to one of the node's own addresses.
		[]string{"-m", "addrtype", "--dst-type", "LOCAL", "-j", ChainNodePort},
		[]string{"-m", "set", "--match-set", c.set(owned.SetClusterIP), "dst,dst", "-j", "ACCEPT"},
		[]string{"-m", "set", "--match-set", c.set(owned.SetLoadBalancer), "dst,dst", "-j", "ACCEPT"},
	)
}

// clusterIPMasqRule decides which ClusterIP traffic gets the masquerade
// mark. Valid configs only: the detector was checked by Validate.
func (c Config) clusterIPMasqRule() []string {
	clusterSet := []string{"-m", "comment", "--comment", commentClusterIPSet, "-m", "set", "--match-set", c.set(owned.SetClusterIP)}
	notLocal, _ := c.LocalDetector.notLocal(c.Family)
	switch {
	case c.MasqueradeAll:
		return concat(clusterSet, "dst,dst", "-j", ChainMarkMasq)
	case notLocal != nil:
		// Off-cluster clients reaching a ClusterIP (static route to the
		// service range) may be answered from another node: masquerade.
		// iptables-save prints the source/interface match first.
		return concat(concat(notLocal, clusterSet...), "dst,dst", "-j", ChainMarkMasq)
	default:
		// The node picks a kube-ipvs0 VIP as source when it connects to a
		// VIP; such VIP:port -> VIP:port traffic must be masqueraded.
		return concat(clusterSet, "src,dst", "-j", ChainMarkMasq)
	}
}

// externalIPRules: traffic to an external IP is masqueraded unless the
// service has externalTrafficPolicy=Local (the LOCAL set), which keeps
// the client address. Both kinds are then accepted when they come from
// off the machine (not bridged from a local container, not from a local
// process) or when the external IP is itself a local address (GCE-style
// load balancers in the local routing table), as kube-proxy does.
func (c Config) externalIPRules() [][]string {
	var rules [][]string
	for _, s := range []struct {
		set, comment string
		masq         bool
	}{
		{c.set(owned.SetExternalIP), commentExternalIPSet, true},
		{c.set(owned.SetExternalIPLocal), commentExternalIPLocal, false},
	} {
		m := setMatch(s.comment, s.set, "dst,dst")
		if s.masq {
			rules = append(rules, concat(m, "-j", ChainMarkMasq))
		}
		rules = append(rules,
			concat(m, "-m", "physdev", "!", "--physdev-is-in", "-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "ACCEPT"),
			concat(m, "-m", "addrtype", "--dst-type", "LOCAL", "-j", "ACCEPT"),
		)
	}
	return rules
}

// nodePortRules is nat KUBE-NODE-PORT (reached for traffic to a local
// address): externalTrafficPolicy=Local ports return unmarked, so the
// client address survives; all other node ports are masqueraded, since
// the endpoint may sit on another node. The LOCAL set must come first.
// TCP and UDP sets are bitmap:port (dst); SCTP sets are hash:ip,port
// (dst,dst), as in kube-proxy.
func (c Config) nodePortRules() [][]string {
	var rules [][]string
	for _, p := range []struct {
		proto, local, all, localComment, allComment, dir string
	}{
		{"tcp", owned.SetNodePortLocalTCP, owned.SetNodePortTCP, commentNodePortLocalTCP, commentNodePortTCP, "dst"},
		{"udp", owned.SetNodePortLocalUDP, owned.SetNodePortUDP, commentNodePortLocalUDP, commentNodePortUDP, "dst"},
		{"sctp", owned.SetNodePortLocalSCTP, owned.SetNodePortSCTP, commentNodePortLocalSCT, commentNodePortSCTP, "dst,dst"},
	} {
		proto := []string{"-p", p.proto}
		rules = append(rules,
			concat(concat(proto, setMatch(p.localComment, c.set(p.local), p.dir)...), "-j", "RETURN"),
			concat(concat(proto, setMatch(p.allComment, c.set(p.all), p.dir)...), "-j", ChainMarkMasq),
		)
	}
	return rules
}

// loadBalancerRules is nat KUBE-LOAD-BALANCER: LB traffic is masqueraded
// unless the service has externalTrafficPolicy=Local. Source ranges are
// enforced in the filter table (KUBE-PROXY-FIREWALL), as kube-proxy has
// done since it dropped nat KUBE-FIREWALL.
func (c Config) loadBalancerRules() [][]string {
	return [][]string{
		concat(setMatch(commentLBLocalSet, c.set(owned.SetLoadBalancerLocal), "dst,dst"), "-j", "RETURN"),
		{"-j", ChainMarkMasq},
	}
}

// postroutingRules is KUBE-POSTROUTING: hairpin traffic (a pod reaching
// itself through a service) and marked traffic get masqueraded; the mark
// is cleared first so a packet that traverses the stack again is not
// masqueraded twice.
func (c Config) postroutingRules() [][]string {
	mm := c.mark() + "/" + c.mark()
	masq := []string{"-m", "comment", "--comment", commentSNAT, "-j", "MASQUERADE"}
	if c.RandomFully {
		masq = append(masq, "--random-fully")
	}
	return [][]string{
		concat(setMatch(commentLoopBackSet, c.set(owned.SetLoopBack), "dst,dst,src"), "-j", "MASQUERADE"),
		{"-m", "mark", "!", "--mark", mm, "-j", "RETURN"},
		// kube-proxy writes "--xor-mark 0x4000"; this is its saved form.
		{"-j", "MARK", "--set-xmark", c.mark() + "/0x0"},
		masq,
	}
}
