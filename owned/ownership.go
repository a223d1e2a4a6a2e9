package owned

import (
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// Ownership is the one rule that says whether a virtual server found in
// the kernel, that no service wants, is ipvsproxy's to remove. The full
// pass prunes by it, and inspect (diff, status, cleanup) reads by it, so
// the proxy and the tools can never disagree about what is foreign.
//
// The kernel is shared and IPVS has no field to mark who made a virtual
// server, so ownership is inferred from objects only ipvsproxy makes:
//   - the address is bound on kube-ipvs0 (a ClusterIP, or an external or
//     load-balancer IP ipvsproxy bound);
//   - its sets hold the exact IP,protocol:port (KUBE-CLUSTER-IP,
//     KUBE-EXTERNAL-IP, KUBE-LOAD-BALANCER, the SCTP node-port hash): an
//     external or load-balancer IP local on another interface, an SCTP
//     node port;
//   - a TCP/UDP node port: the port is in KUBE-NODE-PORT-TCP/UDP (bitmap
//     sets, ports only) AND the address is one ipvsproxy serves node ports
//     on (--nodeport-addresses applied to the node's addresses). The port
//     alone is not enough: a load balancer's VIP or another interface's
//     address may use the same number for something else.
//
// Nothing in --ipvs-exclude-cidrs is ever ipvsproxy's.
type Ownership struct {
	Bound     map[netip.Addr]bool // addresses on kube-ipvs0
	Entries   map[EntryKey]bool   // entries of the owned sets
	NodePorts []netip.Addr        // the addresses node ports are served on
	Exclude   []netip.Prefix      // --ipvs-exclude-cidrs
}

// Owns reports whether the virtual server k is ipvsproxy's; see Ownership.
// It numbers no name (a protocol no entry has, "proto-47", cannot match
// one), so no virtual server the kernel lists can fill the table of
// names EntryKey uses.
func (o Ownership) Owns(k ipvs.ServiceKey) bool {
	if Excluded(o.Exclude, k.Address) {
		return false
	}
	if o.Bound[k.Address] {
		return true
	}
	v6 := k.Address.Is6()
	ipPort := ipset.Entry{IP: k.Address, Protocol: k.Protocol.String(), Port: k.Port}
	for _, set := range []string{SetClusterIP, SetExternalIP, SetLoadBalancer, SetNodePortSCTP} {
		if e, ok := knownKey(SetEntry{Set: SetName(set, v6), Entry: ipPort}); ok && o.Entries[e] {
			return true
		}
	}
	var bitmap string
	switch k.Protocol {
	case ipvs.TCP:
		bitmap = SetNodePortTCP
	case ipvs.UDP:
		bitmap = SetNodePortUDP
	default:
		return false
	}
	e, ok := knownKey(SetEntry{Set: SetName(bitmap, v6), Entry: ipset.Entry{Port: k.Port}})
	return ok && o.Entries[e] && slices.Contains(o.NodePorts, k.Address)
}

// OwnsAddress reports whether an address on kube-ipvs0 is ipvsproxy's:
// every one is, except those in --ipvs-exclude-cidrs (bound there by
// whoever made the excluded virtual servers).
func (o Ownership) OwnsAddress(a netip.Addr) bool { return !Excluded(o.Exclude, a) }

// Excluded reports whether a is in one of the prefixes.
func Excluded(exclude []netip.Prefix, a netip.Addr) bool {
	_, ok := ExcludedBy(exclude, a)
	return ok
}

// ExcludedBy returns the prefix of exclude that holds a, if any.
func ExcludedBy(exclude []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range exclude {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
