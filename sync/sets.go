package sync

import (
	"strings"

	"github.com/ipvsproxy/ipvsproxy/ipset"
)

// The ipsets ipvsproxy keeps, named as kube-proxy names them so operators
// who migrate find what they know in `ipset list`.
const (
	SetClusterIP = "KUBE-CLUSTER-IP" // hash:ip,port — every ClusterIP:port
	SetLoopBack  = "KUBE-LOOP-BACK"  // hash:ip,port,ip — local endpoint hairpin
)

var setTypes = map[string]ipset.Type{
	SetClusterIP: ipset.HashIPPort,
	SetLoopBack:  ipset.HashIPPortIP,
}

// SetName returns the name of a set for a family: the IPv6 twin of
// KUBE-CLUSTER-IP is KUBE-6-CLUSTER-IP, cut to the kernel's 31 characters.
func SetName(base string, v6 bool) string {
	if !v6 {
		return base
	}
	n := "KUBE-6-" + strings.TrimPrefix(base, "KUBE-")
	if len(n) > 31 {
		n = n[:31]
	}
	return n
}

// OwnedSets lists the sets ipvsproxy creates and owns for the enabled
// families. Entries in these sets that no service wants are pruned.
func OwnedSets(v4, v6 bool) []ipset.Set {
	var out []ipset.Set
	for _, fam := range []struct {
		on bool
		v6 bool
		f  ipset.Family
	}{{v4, false, ipset.Inet}, {v6, true, ipset.Inet6}} {
		if !fam.on {
			continue
		}
		for _, base := range []string{SetClusterIP, SetLoopBack} {
			out = append(out, ipset.Set{
				Name:     SetName(base, fam.v6),
				Type:     setTypes[base],
				Family:   fam.f,
				HashSize: ipset.DefaultHashSize,
				MaxElem:  ipset.DefaultMaxElem,
			})
		}
	}
	return out
}
