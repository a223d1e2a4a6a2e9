package sync

import (
	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
)

// serviceFamilies reports which of the node's families svc has.
func serviceFamilies(svc *v1.Service, nodeV6 bool) (v4, v6 bool) {
	if svc == nil {
		return false, false
	}
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case v1.IPv4Protocol:
			v4 = true
		case v1.IPv6Protocol:
			v6 = nodeV6
		}
	}
	if len(svc.Spec.IPFamilies) == 0 { // not yet defaulted: the cluster IP says
		v4 = true
	}
	return v4, v6
}

type familyFlows struct {
	family string
	flows  []conntrack.Flow
}

// splitFlows groups stale flows by family, so that kube-proxy's
// per-family conntrack reconciler metrics can be kept. A batch has flows
// of both families only on a dual-stack node that removed UDP backends
// of both in it; that batch walks the table twice.
func splitFlows(flows []conntrack.Flow) []familyFlows {
	var v4, v6 []conntrack.Flow
	for _, f := range flows {
		a := f.Destination
		if f.NodePort || !a.IsValid() {
			a = f.Backend
		}
		if a.Is6() && !a.Is4In6() {
			v6 = append(v6, f)
		} else {
			v4 = append(v4, f)
		}
	}
	var out []familyFlows
	if len(v4) > 0 {
		out = append(out, familyFlows{FamilyIPv4, v4})
	}
	if len(v6) > 0 {
		out = append(out, familyFlows{FamilyIPv6, v6})
	}
	return out
}
