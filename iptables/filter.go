package iptables

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
				concat(setMatch(commentHealthCheckSet, c.set(SetHealthCheckNodePort), "dst"), "-j", "ACCEPT"),
			}},
			{ChainProxyFirewall, [][]string{
				concat(setMatch(commentLBFWSet, c.set(SetLoadBalancerFW), "dst,dst"), "-j", ChainSourceRangesFirewall),
			}},
			{ChainSourceRangesFirewall, c.sourceRangesRules()},
			{ChainIPVSFilter, c.ipvsFilterRules()},
			// kube-proxy fills KUBE-IPVS-OUT-FILTER with one
			// "-s LBIP -m ipvs --vaddr LBIP --vport P -j DROP" rule per
			// source-ranged LB the node itself may not reach (#119656).
			// That is per-service state in rules, which ipvsproxy does not
			// write: by the time filter OUTPUT runs IPVS has rewritten the
			// destination, so no set match can see LB IP:port any more.
			// The chain and its jump exist so the layout matches and a
			// kube-proxy node's chain is adopted (and flushed).
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
		concat(setMatch(commentLBSourceCIDRSet, c.set(SetLoadBalancerSrcCIDR), "dst,dst,src"), "-j", "RETURN"),
		concat(setMatch(commentLBSourceIPSet, c.set(SetLoadBalancerSrcIP), "dst,dst,src"), "-j", "RETURN"),
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
		{"-m", "set", "--match-set", c.set(SetLoadBalancer), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(SetClusterIP), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(SetExternalIP), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(SetExternalIPLocal), "dst,dst", "-j", "RETURN"},
		{"-m", "set", "--match-set", c.set(SetHealthCheckNodePort), "dst", "-j", "RETURN"},
		// kube-proxy writes a bare "-j REJECT"; this is its saved form.
		{"-m", "conntrack", "--ctstate", "NEW", "-m", "set", "--match-set", c.set(SetIPVSIPs), "dst", "-j", "REJECT", "--reject-with", reject},
	}
}
