package sync

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// serviceBuilder accumulates one service's kernel objects.
type serviceBuilder struct {
	svc      *v1.Service
	cfg      *Config
	out      *Built
	sched    string
	flags    ipvs.Flags
	affinity uint32
	weights  endpointWeights

	externalIPs  []netip.Addr
	lbIPs        []netip.Addr
	sourceRanges []netip.Prefix
	localEps     map[ipvs.RealKey]bool // made at the first local endpoint: most services have none here
	programmed   [2]bool               // the IP families with at least one port: [0] IPv4, [1] IPv6
}

func (b *serviceBuilder) problem(format string, args ...any) {
	b.out.Problems = append(b.out.Problems, fmt.Sprintf(format, args...))
}

// excluded reports, with a problem, a service address inside
// --ipvs-exclude-cidrs: what is there is someone else's, so the service
// writes nothing for it (no virtual server, address or set entry).
func (b *serviceBuilder) excluded(what string, a netip.Addr) bool {
	p, ok := owned.ExcludedBy(b.cfg.ExcludeCIDRs, a)
	if ok {
		b.problem("%s %s is in --ipvs-exclude-cidrs %s; not programmed", what, a, p)
	}
	return ok
}

// parseExternal validates the service's external IPs, load-balancer
// ingress IPs and source ranges once, reporting what is malformed.
func (b *serviceBuilder) parseExternal() {
	for _, s := range b.svc.Spec.ExternalIPs {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" || !ip.Unmap().IsGlobalUnicast() {
			b.problem("externalIP %q is not a unicast IP address", truncate(s))
			continue
		}
		if !b.excluded("externalIP", ip.Unmap()) {
			b.externalIPs = append(b.externalIPs, ip.Unmap())
		}
	}
	if b.svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		for _, ing := range b.svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" {
				continue // hostname-only ingress: nothing to program
			}
			if ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
				continue // the load balancer proxies; traffic arrives for the node, not the VIP
			}
			ip, err := netip.ParseAddr(ing.IP)
			if err != nil || ip.Zone() != "" || !ip.Unmap().IsGlobalUnicast() {
				b.problem("load balancer ingress IP %q is not a unicast IP address", truncate(ing.IP))
				continue
			}
			if !b.excluded("load balancer ingress IP", ip.Unmap()) {
				b.lbIPs = append(b.lbIPs, ip.Unmap())
			}
		}
		for _, s := range b.svc.Spec.LoadBalancerSourceRanges {
			b.sourceRange(s)
		}
	}
}

// sourceRange parses one loadBalancerSourceRanges value. An IPv4-mapped
// IPv6 range (::ffff:a.b.c.d/n, n ≥ 96) is read as the IPv4 range it maps,
// as Go's net package and so kube-proxy classify it: no IPv6 packet carries
// such a source, so in an inet6 set it would match nothing (and the ipset
// adapter refuses it there).
func (b *serviceBuilder) sourceRange(s string) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		b.problem("loadBalancerSourceRanges: %q is not a CIDR", truncate(s))
		return
	}
	p = p.Masked()
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		v4 := netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		b.problem("loadBalancerSourceRanges: %q is an IPv4-mapped IPv6 range; applied as %s", truncate(s), v4)
		p = v4
	}
	b.sourceRanges = append(b.sourceRanges, p)
}

// port adds every virtual server of one service port in the family of ip
// (the ClusterIP), with its set entries and addresses.
func (b *serviceBuilder) port(ip netip.Addr, sp *v1.ServicePort, slices []*ProxySlice) {
	proto, ok := protocolOf(sp.Protocol)
	if !ok {
		b.problem("port %q: protocol %q is not supported", sp.Name, truncate(string(sp.Protocol)))
		return
	}
	if sp.Port < 1 || sp.Port > 65535 {
		b.problem("port %q: port %d is out of range 1-65535", sp.Name, sp.Port)
		return
	}
	v6 := ip.Is6()
	b.programmed[family(v6)] = true
	port := uint16(sp.Port)
	eps := collectEndpoints(slices, sp, v6, b.cfg.NodeName)
	cluster, external, noLocalIn, noLocalEx := categorize(b.svc, eps, b.cfg)
	b.out.NoLocalInternal = b.out.NoLocalInternal || noLocalIn
	b.out.NoLocalExternal = b.out.NoLocalExternal || noLocalEx
	for _, e := range eps {
		if e.local && (e.ready || e.serving && e.terminating) {
			if b.localEps == nil {
				b.localEps = map[ipvs.RealKey]bool{}
			}
			b.localEps[e.key] = true
			b.entry(owned.SetLoopBack, v6, ipset.Entry{IP: e.key.Address, Protocol: proto.String(), Port: e.key.Port, IP2: e.key.Address})
		}
	}
	local := b.svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal

	b.virtualServer(ip, proto, port, cluster)
	b.bind(ip)
	b.entry(owned.SetClusterIP, v6, ipset.Entry{IP: ip, Protocol: proto.String(), Port: port})

	for _, eip := range b.externalIPs {
		if eip.Is6() == v6 {
			b.externallyReached(eip, proto, port, external, owned.SetExternalIP, owned.SetExternalIPLocal, local)
		}
	}
	for _, lb := range b.lbIPs {
		if lb.Is6() == v6 {
			b.externallyReached(lb, proto, port, external, owned.SetLoadBalancer, owned.SetLoadBalancerLocal, local)
			b.sourceRangeEntries(lb, proto, port, v6)
		}
	}
	b.nodePort(sp, proto, v6, local, external)
}

// externallyReached adds the virtual server of an external or
// load-balancer IP: bound unless the node already has the address, listed
// in its set, and in the set's -LOCAL twin under externalTrafficPolicy=Local.
func (b *serviceBuilder) externallyReached(ip netip.Addr, proto ipvs.Protocol, port uint16, eps []endpoint, set, localSet string, local bool) {
	b.virtualServer(ip, proto, port, eps)
	b.bindUnlessHost(ip)
	e := ipset.Entry{IP: ip, Protocol: proto.String(), Port: port}
	b.entry(set, ip.Is6(), e)
	if local {
		b.entry(localSet, ip.Is6(), e)
	}
}

// sourceRangeEntries restricts a load-balancer IP:port to its
// loadBalancerSourceRanges: the FW set marks it as restricted, the
// SOURCE-CIDR set lists who may come in. When a range holds one of the
// node's own addresses, the node may reach the LB IP through itself
// (hairpin), as in kube-proxy: a SOURCE-IP entry with the LB IP as source.
// A range covering the whole family (0.0.0.0/0, ::/0) lets every client
// in, so that family's LB IPs get no firewall entry at all, as in
// kube-proxy (kubernetes#132722): the kernel refuses a /0 net, and an FW
// entry without it would drop every client.
func (b *serviceBuilder) sourceRangeEntries(lb netip.Addr, proto ipvs.Protocol, port uint16, v6 bool) {
	var ranges []netip.Prefix
	for _, p := range b.sourceRanges {
		if p.Addr().Is6() != v6 {
			continue
		}
		if p.Bits() == 0 {
			return // everyone may come in
		}
		ranges = append(ranges, p)
	}
	if len(ranges) == 0 {
		return
	}
	b.entry(owned.SetLoadBalancerFW, v6, ipset.Entry{IP: lb, Protocol: proto.String(), Port: port})
	allowNode := false
	for _, p := range ranges {
		b.entry(owned.SetLoadBalancerSrcCIDR, v6, ipset.Entry{IP: lb, Protocol: proto.String(), Port: port, Net: p})
		for _, a := range b.cfg.NodePortAddresses {
			allowNode = allowNode || p.Contains(a)
		}
	}
	if allowNode {
		b.entry(owned.SetLoadBalancerSrcIP, v6, ipset.Entry{IP: lb, Protocol: proto.String(), Port: port, IP2: lb})
	}
}

// nodePort adds the node-port virtual servers (one per node address of the
// family) and the node-port set entries.
func (b *serviceBuilder) nodePort(sp *v1.ServicePort, proto ipvs.Protocol, v6, local bool, eps []endpoint) {
	if b.svc.Spec.Type != v1.ServiceTypeNodePort && b.svc.Spec.Type != v1.ServiceTypeLoadBalancer || sp.NodePort == 0 {
		return
	}
	if sp.NodePort < 1 || sp.NodePort > 65535 {
		b.problem("port %q: nodePort %d is out of range 1-65535", sp.Name, sp.NodePort)
		return
	}
	np := uint16(sp.NodePort)
	for _, a := range b.cfg.NodePortAddresses {
		if a.Is6() != v6 {
			continue
		}
		b.virtualServer(a, proto, np, eps)
		if proto == ipvs.SCTP {
			e := ipset.Entry{IP: a, Protocol: "sctp", Port: np}
			b.entry(owned.SetNodePortSCTP, v6, e)
			if local {
				b.entry(owned.SetNodePortLocalSCTP, v6, e)
			}
		}
	}
	var set, localSet string
	switch proto {
	case ipvs.TCP:
		set, localSet = owned.SetNodePortTCP, owned.SetNodePortLocalTCP
	case ipvs.UDP:
		set, localSet = owned.SetNodePortUDP, owned.SetNodePortLocalUDP
	default:
		return
	}
	b.entry(set, v6, ipset.Entry{Port: np})
	if local {
		b.entry(localSet, v6, ipset.Entry{Port: np})
	}
}

func (b *serviceBuilder) virtualServer(addr netip.Addr, proto ipvs.Protocol, port uint16, eps []endpoint) {
	vs := ipvs.VirtualServer{
		ServiceKey: ipvs.ServiceKey{Address: addr, Protocol: proto, Port: port},
		Scheduler:  b.sched,
		Flags:      b.flags,
	}
	if b.affinity > 0 {
		vs.Flags |= ipvs.FlagPersistent
		vs.Timeout = b.affinity
	}
	st := VirtualServerState{VS: vs, Reals: make([]ipvs.RealServer, 0, len(eps))}
	for _, e := range eps {
		st.Reals = append(st.Reals, ipvs.RealServer{RealKey: e.key, Weight: b.weights.weightOf(e.zone, e.node)})
	}
	b.out.State.VirtualServers = append(b.out.State.VirtualServers, st)
}

// bind puts a service address on kube-ipvs0 and in KUBE-IPVS-IPS.
func (b *serviceBuilder) bind(a netip.Addr) {
	b.out.State.Addresses = append(b.out.State.Addresses, a)
	b.entry(owned.SetIPVSIPs, a.Is6(), ipset.Entry{IP: a})
}

// bindUnlessHost binds an external or load-balancer IP unless it is
// already an address of another interface of the node.
func (b *serviceBuilder) bindUnlessHost(a netip.Addr) {
	if _, found := slices.BinarySearchFunc(b.cfg.HostAddresses, a, netip.Addr.Compare); found {
		return
	}
	b.bind(a)
}

func (b *serviceBuilder) entry(base string, v6 bool, e ipset.Entry) {
	b.out.State.Entries = append(b.out.State.Entries, owned.SetEntry{Set: owned.SetName(base, v6), Entry: e})
}

// family indexes serviceBuilder.programmed: 0 for IPv4, 1 for IPv6.
func family(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}
