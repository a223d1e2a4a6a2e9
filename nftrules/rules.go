package nftrules

import (
	"net/netip"

	"github.com/ipvsproxy/ipvsproxy/iptables"
)

// layout builds the table's structure for one Config: the iptables
// backend's fixed rules (iptables/nat.go, iptables/filter.go), rule for
// rule, with a set lookup wherever those match an ipset. c must be valid.
//
// Three things differ:
//   - KUBE-SERVICES's trailing "-j ACCEPT"s and KUBE-FORWARD, filter
//     KUBE-NODE-PORT's health-check "-j ACCEPT" keep other software's
//     rules from dropping service traffic in the iptables tables. An
//     nftables accept ends only this table's chain, never another
//     table's (each table's base chains run in turn at a hook, and any
//     of them may still drop), so they are left out (an operator with
//     a dropping FORWARD or INPUT policy must allow service traffic there,
//     as with kube-proxy's nftables mode). KUBE-IPVS-OUT-FILTER is empty
//     in the iptables backend and has no counterpart.
//   - An external IP's two conditional ACCEPTs in KUBE-SERVICES become
//     one plain accept: within this chain the only rule they skip is the
//     node-port jump, which requires a local destination, and the
//     destination-local ACCEPT already takes those; the physdev match
//     has no inet-family equivalent and changes nothing here.
//   - The masquerade-all and detector rules read one family each (an
//     inet table sees both), so every family-specific rule is written
//     once per enabled family, IPv4 first.
func (c Config) layout() tableSpec {
	t := tableSpec{sets: setsFor(c.IPv4, c.IPv6)}
	l := &layoutBuilder{c: c, t: t}
	t.chains = []chainSpec{
		{name: chainNATPrerouting, hook: hookNATPrerouting, rules: []rule{{jumpTo(chainServices)}}},
		{name: chainNATOutput, hook: hookNATOutput, rules: []rule{{jumpTo(chainServices)}}},
		{name: chainNATPostrouting, hook: hookNATPostrouting, rules: []rule{{jumpTo(chainPostrouting)}}},
		{name: chainFilterInput, hook: hookFilterInput, rules: []rule{{jumpTo(chainIPVSFilter)}, {jumpTo(chainProxyFirewall)}}},
		{name: chainFilterForward, hook: hookFilterForward, rules: []rule{{jumpTo(chainProxyFirewall)}}},
		// mangle OUTPUT: the node's own connections to a source-ranged
		// load balancer, before IPVS rewrites their destination
		// (kubernetes#119656; see iptables.Config.mangleTable).
		{name: chainMangleOutput, hook: hookMangleOutput, rules: []rule{{jumpTo(chainProxyFirewall)}}},
		{name: chainServices, rules: l.services()},
		{name: chainNodePort, rules: l.nodePort()},
		{name: chainLoadBalancer, rules: l.loadBalancer()},
		{name: chainMarkMasq, rules: []rule{{markSet{bit: c.mark()}}}},
		{name: chainPostrouting, rules: l.postrouting()},
		{name: chainProxyFirewall, rules: l.perFamily(func(v6 bool) rule {
			return rule{l.dst(setLoadBalancerFW, v6), jumpTo(chainSourceRangesFW)}
		})},
		{name: chainSourceRangesFW, rules: l.sourceRanges()},
		{name: chainIPVSFilter, rules: l.ipvsFilter()},
	}
	return t
}

func (c Config) mark() uint32 { return 1 << c.MasqueradeBit }

// nft set base names (see mappings).
const (
	setLoopBack          = "loop-back"
	setClusterIP         = "cluster-ip"
	setExternalIP        = "external-ip"
	setExternalIPLocal   = "external-ip-local"
	setLoadBalancer      = "load-balancer"
	setLoadBalancerLocal = "load-balancer-local"
	setLoadBalancerFW    = "load-balancer-fw"
	setLBSourceIP        = "load-balancer-source-ip"
	setLBSourceCIDR      = "load-balancer-source-cidr"
	setNodePort          = "node-port"
	setNodePortLocal     = "node-port-local"
	setNodePortSCTP      = "node-port-sctp"
	setNodePortLocalSCTP = "node-port-local-sctp"
	setHealthCheck       = "health-check-node-port"
	setIPVSIPs           = "ipvs-ips"
)

type layoutBuilder struct {
	c Config
	t tableSpec
}

func (l *layoutBuilder) perFamily(fn func(v6 bool) rule) []rule {
	var out []rule
	for _, v6 := range l.c.families() {
		out = append(out, fn(v6))
	}
	return out
}

func (l *layoutBuilder) set(base string, v6 bool) *setSpec {
	return l.t.set(setName(base, v6))
}

// dst is ipset's "dst,dst" on a hash:ip,port set.
func (l *layoutBuilder) dst(base string, v6 bool) lookup {
	return lookup{sel: []selector{selDaddr, selL4Proto, selDport}, set: l.set(base, v6)}
}

// dstSrc is "dst,dst,src" on a hash:ip,port,ip or hash:ip,port,net set.
func (l *layoutBuilder) dstSrc(base string, v6 bool) lookup {
	return lookup{sel: []selector{selDaddr, selL4Proto, selDport, selSaddr}, set: l.set(base, v6)}
}

// services is KUBE-SERVICES.
func (l *layoutBuilder) services() []rule {
	var out []rule
	out = append(out, l.perFamily(func(v6 bool) rule {
		loopback := netip.MustParsePrefix("127.0.0.0/8")
		if v6 {
			loopback = netip.MustParsePrefix("::1/128")
		}
		return rule{sourcePrefix{prefix: loopback}, ret}
	})...)
	out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(setLoadBalancer, v6), jumpTo(chainLoadBalancer)} })...)
	out = append(out, l.perFamily(l.clusterIPMasq)...)
	out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(setExternalIP, v6), jumpTo(chainMarkMasq)} })...)
	out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(setExternalIP, v6), accept} })...)
	out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(setExternalIPLocal, v6), accept} })...)
	return append(out, rule{destLocal{}, jumpTo(chainNodePort)})
}

// clusterIPMasq decides which ClusterIP traffic gets the masquerade
// mark, as iptables.Config.clusterIPMasqRule does.
func (l *layoutBuilder) clusterIPMasq(v6 bool) rule {
	family := iptables.IPv4
	if v6 {
		family = iptables.IPv6
	}
	notLocal, ok, _ := l.c.LocalDetector.NotLocalFor(family) // checked by Validate
	masq := jumpTo(chainMarkMasq)
	switch {
	case l.c.MasqueradeAll:
		return rule{l.dst(setClusterIP, v6), masq}
	case ok && notLocal.Source.IsValid():
		return rule{sourcePrefix{prefix: notLocal.Source, negate: true}, l.dst(setClusterIP, v6), masq}
	case ok:
		return rule{notInterface{name: notLocal.Interface, namePrefix: notLocal.NamePrefix}, l.dst(setClusterIP, v6), masq}
	}
	// The detector cannot tell: masquerade VIP:port -> VIP:port (a node
	// connection that picked a kube-ipvs0 address as its source).
	return rule{lookup{sel: []selector{selSaddr, selL4Proto, selDport}, set: l.set(setClusterIP, v6)}, masq}
}

// nodePort is nat KUBE-NODE-PORT: externalTrafficPolicy=Local ports
// return unmarked, the others are masqueraded. One set per family holds
// TCP and UDP (protocol . port); SCTP keeps address . protocol . port.
func (l *layoutBuilder) nodePort() []rule {
	var out []rule
	for _, s := range []struct {
		set string
		v   verdict
	}{{setNodePortLocal, ret}, {setNodePort, jumpTo(chainMarkMasq)}} {
		out = append(out, l.perFamily(func(v6 bool) rule {
			return rule{familyMatch{v6}, lookup{sel: []selector{selL4Proto, selDport}, set: l.set(s.set, v6)}, s.v}
		})...)
	}
	out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(setNodePortLocalSCTP, v6), ret} })...)
	return append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(setNodePortSCTP, v6), jumpTo(chainMarkMasq)} })...)
}

// loadBalancer is KUBE-LOAD-BALANCER.
func (l *layoutBuilder) loadBalancer() []rule {
	out := l.perFamily(func(v6 bool) rule { return rule{l.dst(setLoadBalancerLocal, v6), ret} })
	return append(out, rule{jumpTo(chainMarkMasq)})
}

// postrouting is KUBE-POSTROUTING: hairpin, then marked traffic, whose
// mark is cleared first.
func (l *layoutBuilder) postrouting() []rule {
	out := l.perFamily(func(v6 bool) rule { return rule{l.dstSrc(setLoopBack, v6), masquerade{}} })
	return append(out,
		rule{markUnset{bit: l.c.mark()}, ret},
		rule{markSet{bit: l.c.mark(), xor: true}},
		rule{masquerade{fullyRandom: l.c.RandomFully}},
	)
}

// sourceRanges is KUBE-SOURCE-RANGES-FIREWALL.
func (l *layoutBuilder) sourceRanges() []rule {
	out := l.perFamily(func(v6 bool) rule { return rule{l.dstSrc(setLBSourceCIDR, v6), ret} })
	out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dstSrc(setLBSourceIP, v6), ret} })...)
	return append(out, rule{drop})
}

// ipvsFilter is KUBE-IPVS-FILTER (kubernetes#72236): service IP:port
// pairs and health-check ports return; a new connection to any other
// port of a kube-ipvs0 address is rejected.
func (l *layoutBuilder) ipvsFilter() []rule {
	var out []rule
	for _, s := range []string{setLoadBalancer, setClusterIP, setExternalIP, setExternalIPLocal} {
		out = append(out, l.perFamily(func(v6 bool) rule { return rule{l.dst(s, v6), ret} })...)
	}
	out = append(out, l.perFamily(func(v6 bool) rule {
		return rule{familyMatch{v6}, lookup{sel: []selector{selDport}, set: l.set(setHealthCheck, v6)}, ret}
	})...)
	return append(out, l.perFamily(func(v6 bool) rule {
		return rule{ctStateNew{}, lookup{sel: []selector{selDaddr}, set: l.set(setIPVSIPs, v6)}, reject{}}
	})...)
}
