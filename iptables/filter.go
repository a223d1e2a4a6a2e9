package iptables

import "github.com/ipvsproxy/ipvsproxy/owned"

// filterTable is kube-proxy's filter table for IPVS mode. The jumps are
// listed in kube-proxy's order; each missing one is inserted at the top,
// so INPUT ends up as KUBE-IPVS-FILTER, KUBE-PROXY-FIREWALL,
// KUBE-NODE-PORT, as on a kube-proxy node.
func (c Config) filterTable() tableSpec {
	return tableSpec{
		name: TableFilter,
		chains: []chainSpec{
			{ChainForward, c.forwardRules()},
			{ChainNodePort, [][]string{
				// healthCheckNodePorts must be reachable even when the
				// INPUT policy is DROP: load balancers probe them.
				concat(setMatch(commentHealthCheckSet, c.set(owned.SetHealthCheckNodePort), "dst"), "-j", "ACCEPT"),
			}},
			{ChainProxyFirewall, c.proxyFirewallRules()},
			{ChainSourceRangesFirewall, c.sourceRangesRules()},
			{ChainIPVSFilter, c.ipvsFilterRules()},
			// kube-proxy fills KUBE-IPVS-OUT-FILTER with one
			// "-s LBIP -m ipvs --vaddr LBIP -j DROP" rule per
			// source-ranged LB the node itself may not reach (#119656):
			// per-service state in rules. ipvsproxy does that with fixed
			// rules in the mangle table instead (mangleTable), where the
			// destination is still LB IP:port. The chain and its jump
			// exist so the layout matches and a kube-proxy node's chain
			// is adopted (and flushed).
			{ChainIPVSOutFilter, nil},
			{ChainCanary, nil},
		},
		jumps: []jumpSpec{
			{"FORWARD", jumpRule(commentForward, ChainForward)},
			{"INPUT", jumpRule(commentHealthCheck, ChainNodePort)},
			{"INPUT", jumpRule(commentProxyFirewall, ChainProxyFirewall)},
			{"FORWARD", jumpRule(commentProxyFirewall, ChainProxyFirewall)},
			{"INPUT", jumpRule(commentIPVSFilter, ChainIPVSFilter)},
			{"OUTPUT", jumpRule(commentIPVSFilter, ChainIPVSOutFilter)},
		},
	}
}

// mangleTable keeps the node's own traffic to a source-ranged load
// balancer inside loadBalancerSourceRanges (kubernetes#119656). Such
// traffic never reaches filter INPUT: IPVS takes it at LOCAL_OUT, just
// after nat OUTPUT, and rewrites the destination to a pod, so by filter
// OUTPUT no set can see LB IP:port any more. mangle OUTPUT runs before
// IPVS, so the same two chains as filter's apply there unchanged: the
// source is the LB IP itself (the kernel picks the destination's own
// address), allowed when a range holds one of the node's addresses
// (the engine's SOURCE-IP entry), or the address a client bound to.
func (c Config) mangleTable() tableSpec {
	return tableSpec{
		name: TableMangle,
		chains: []chainSpec{
			{ChainProxyFirewall, c.proxyFirewallRules()},
			{ChainSourceRangesFirewall, c.sourceRangesRules()},
			{ChainCanary, nil},
		},
		jumps: []jumpSpec{
			{"OUTPUT", jumpRule(commentProxyFirewall, ChainProxyFirewall)},
		},
	}
}

// proxyFirewallRules is KUBE-PROXY-FIREWALL: LB IP:port with source
// ranges goes through KUBE-SOURCE-RANGES-FIREWALL.
func (c Config) proxyFirewallRules() [][]string {
	return [][]string{
		concat(setMatch(commentLBFWSet, c.set(owned.SetLoadBalancerFW), "dst,dst"), "-j", ChainSourceRangesFirewall),
	}
}

// forwardRules is KUBE-FORWARD: let marked (service) traffic and its
// replies through even when the FORWARD policy is DROP.
func (c Config) forwardRules() [][]string {
	mm := c.mark() + "/" + c.mark()
	return [][]string{
		{"-m", "comment", "--comment", commentForward, "-m", "mark", "--mark", mm, "-j", "ACCEPT"},
		{"-m", "comment", "--comment", commentForwardConntrack, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
	}
}

// sourceRangesRules is KUBE-SOURCE-RANGES-FIREWALL, reached for LB IP:port
// with loadBalancerSourceRanges: an allowed source CIDR or source IP
// (the engine puts the LB IP itself there when the node may reach it)
// returns; anything else is dropped.
func (c Config) sourceRangesRules() [][]string {
	return [][]string{
		concat(setMatch(commentLBSourceCIDRSet, c.set(owned.SetLoadBalancerSrcCIDR), "dst,dst,src"), "-j", "RETURN"),
		concat(setMatch(commentLBSourceIPSet, c.set(owned.SetLoadBalancerSrcIP), "dst,dst,src"), "-j", "RETURN"),
		{"-j", "DROP"},
	}
}

// ipvsFilterRules is KUBE-IPVS-FILTER (kubernetes#72236): every service
// address is bound to kube-ipvs0, so without this chain a host process
// listening on 0.0.0.0:22 would answer on every ClusterIP, external IP
// and LB IP. Service IP:port pairs (and health-check ports) return; a new
// connection to any other port of a kube-ipvs0 address is rejected.
// Established traffic is left alone so replies to node-originated
// connections sourced from a VIP still arrive.
func (c Config) ipvsFilterRules() [][]string {
	reject := "icmp-port-unreachable"
	if c.Family == IPv6 {
		reject = "icmp6-port-unreachable"
	}
	return [][]string{
		{"-m", "set", "--match-set", c.set(owned.SetLoadBalancer), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(owned.SetClusterIP), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(owned.SetExternalIP), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(owned.SetExternalIPLocal), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(owned.SetHealthCheckNodePort), "dst", "-j", "RETURN"},
		// kube-proxy writes a bare "-j REJECT"; this is its saved form.
		{"-m", "conntrack", "--ctstate", "NEW", "-m", "set", "--match-set", c.set(owned.SetIPVSIPs), "dst", "-j", "REJECT", "--reject-with", reject},
	}
}
