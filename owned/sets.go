// Package owned is the one home of what ipvsproxy owns in the kernel: the
// names and types of its ipsets, the rule that says which virtual servers
// and addresses are its own (Ownership), and the bundle of kernel adapters
// that hold them (Kernel). The engine (sync), the operator commands
// (inspect, cleanup) and the fixed rules (iptables) all import it, so they
// cannot drift apart: a set the rules match on is the set the engine
// fills, and what diff calls foreign is what the full pass leaves alone.
//
// It is a leaf: it imports only the adapters' types.
package owned

import (
	"cmp"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// The ipsets ipvsproxy keeps, named as kube-proxy names them so operators
// who migrate find what they know in `ipset list`. The fixed iptables
// rules match on these sets, so per-service state never becomes a rule.
const (
	SetLoopBack            = "KUBE-LOOP-BACK"                 // hash:ip,port,ip — local endpoint hairpin
	SetClusterIP           = "KUBE-CLUSTER-IP"                // hash:ip,port — every ClusterIP:port
	SetExternalIP          = "KUBE-EXTERNAL-IP"               // hash:ip,port — external IP:port
	SetExternalIPLocal     = "KUBE-EXTERNAL-IP-LOCAL"         // hash:ip,port — same, externalTrafficPolicy=Local
	SetLoadBalancer        = "KUBE-LOAD-BALANCER"             // hash:ip,port — LB ingress IP:port
	SetLoadBalancerLocal   = "KUBE-LOAD-BALANCER-LOCAL"       // hash:ip,port — same, externalTrafficPolicy=Local
	SetLoadBalancerFW      = "KUBE-LOAD-BALANCER-FW"          // hash:ip,port — LB IP:port with source ranges
	SetLoadBalancerSrcIP   = "KUBE-LOAD-BALANCER-SOURCE-IP"   // hash:ip,port,ip — LB IP, port, allowed source IP
	SetLoadBalancerSrcCIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR" // hash:ip,port,net — LB IP, port, allowed source CIDR
	SetNodePortTCP         = "KUBE-NODE-PORT-TCP"             // bitmap:port — node ports
	SetNodePortUDP         = "KUBE-NODE-PORT-UDP"             // bitmap:port
	SetNodePortLocalTCP    = "KUBE-NODE-PORT-LOCAL-TCP"       // bitmap:port — node ports, externalTrafficPolicy=Local
	SetNodePortLocalUDP    = "KUBE-NODE-PORT-LOCAL-UDP"       // bitmap:port
	SetNodePortSCTP        = "KUBE-NODE-PORT-SCTP-HASH"       // hash:ip,port — SCTP: node IP:port
	SetNodePortLocalSCTP   = "KUBE-NODE-PORT-LOCAL-SCTP-HASH" // hash:ip,port
	SetHealthCheckNodePort = "KUBE-HEALTH-CHECK-NODE-PORT"    // bitmap:port — healthCheckNodePorts
	SetIPVSIPs             = "KUBE-IPVS-IPS"                  // hash:ip — every address on kube-ipvs0
)

// setOrder is the order sets are created in, and their types.
var setOrder = []struct {
	base string
	typ  ipset.Type
}{
	{SetLoopBack, ipset.HashIPPortIP},
	{SetClusterIP, ipset.HashIPPort},
	{SetExternalIP, ipset.HashIPPort},
	{SetExternalIPLocal, ipset.HashIPPort},
	{SetLoadBalancer, ipset.HashIPPort},
	{SetLoadBalancerLocal, ipset.HashIPPort},
	{SetLoadBalancerFW, ipset.HashIPPort},
	{SetLoadBalancerSrcIP, ipset.HashIPPortIP},
	{SetLoadBalancerSrcCIDR, ipset.HashIPPortNet},
	{SetNodePortTCP, ipset.BitmapPort},
	{SetNodePortUDP, ipset.BitmapPort},
	{SetNodePortLocalTCP, ipset.BitmapPort},
	{SetNodePortLocalUDP, ipset.BitmapPort},
	{SetNodePortSCTP, ipset.HashIPPort},
	{SetNodePortLocalSCTP, ipset.HashIPPort},
	{SetHealthCheckNodePort, ipset.BitmapPort},
	{SetIPVSIPs, ipset.HashIP},
}

// SetName returns kube-proxy's name of a set for a family: the IPv6 twin
// of KUBE-CLUSTER-IP is KUBE-6-CLUSTER-IP, cut to the kernel's 31
// characters.
func SetName(base string, v6 bool) string {
	if v6 && strings.HasPrefix(base, "KUBE-") {
		base = "KUBE-6-" + strings.TrimPrefix(base, "KUBE-")
	}
	if len(base) > 31 {
		base = base[:31]
	}
	return base
}

// Sets lists the sets ipvsproxy creates and owns for the enabled
// families, in creation order. Entries in these sets that no service
// wants are pruned.
func Sets(v4, v6 bool) []ipset.Set {
	var out []ipset.Set
	for _, fam := range []struct {
		on bool
		v6 bool
		f  ipset.Family
	}{{v4, false, ipset.Inet}, {v6, true, ipset.Inet6}} {
		if !fam.on {
			continue
		}
		for _, s := range setOrder {
			set := ipset.Set{Name: SetName(s.base, fam.v6), Type: s.typ}
			if s.typ == ipset.BitmapPort {
				set.PortFrom, set.PortTo = 0, 65535
			} else {
				set.Family, set.HashSize, set.MaxElem = fam.f, ipset.DefaultHashSize, ipset.DefaultMaxElem
			}
			out = append(out, set)
		}
	}
	return out
}

// SetNames is the names of Sets(v4, v6), in creation order.
func SetNames(v4, v6 bool) []string {
	var names []string
	for _, s := range Sets(v4, v6) {
		names = append(names, s.Name)
	}
	return names
}

// SetEntry is one member of one ipset.
type SetEntry struct {
	Set   string
	Entry ipset.Entry
}

// CompareSetEntries orders set entries by set name, then entry fields: the
// order of a service's record, and of what inspect lists.
func CompareSetEntries(a, b SetEntry) int {
	x, y := a.Entry, b.Entry
	return cmp.Or(cmp.Compare(a.Set, b.Set), x.IP.Compare(y.IP), cmp.Compare(x.Protocol, y.Protocol),
		cmp.Compare(x.Port, y.Port), x.IP2.Compare(y.IP2), x.Net.Addr().Compare(y.Net.Addr()),
		cmp.Compare(x.Net.Bits(), y.Net.Bits()))
}
