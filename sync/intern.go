package sync

import (
	"slices"
	gosync "sync"
	"unique"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Sharing of the values that repeat across the informers' objects. The
// decoder gives every object its own copy of every string and pointer;
// a cluster's 100,000 Services have a few namespaces, a few port names
// and one protocol, so StripForProxy points the stored objects at one
// copy of each instead.
//
// Two ways, both bounded:
//   - strings go through the unique package: its table holds each value
//     only while some object still uses it (weak references), so a value
//     that churns away leaves nothing behind. Only values that repeat are
//     worth it (a table entry costs more than a short string): names of
//     services, addresses and UIDs are left as they are;
//   - pointer fields (*string, *int32, the API's *enum) are shared
//     through internTable, whose bound empties it: a cluster with endless
//     distinct values costs at most that many entries, and an object
//     keeps working whichever copy it points at.
//
// Nobody writes through a stored object (the informer's objects are
// read-only by contract), so sharing a value between objects is safe.

// internTable hands out one shared *T per distinct value. The table is
// emptied when it reaches its bound.
type internTable[T comparable] struct {
	mu    gosync.Mutex
	max   int
	table map[T]*T
}

var (
	zones = &internTable[string]{max: 1 << 10}
	// nodeNames holds the other nodes' names; its bound is past the
	// largest clusters Kubernetes supports (5,000 nodes).
	nodeNames    = &internTable[string]{max: 1 << 14}
	portNames    = &internTable[string]{max: 1 << 12}
	appProtocols = &internTable[string]{max: 1 << 10}
	portNumbers  = &internTable[int32]{max: 1 << 12}
	protocols    = &internTable[v1.Protocol]{max: 16}
	familyPolicy = &internTable[v1.IPFamilyPolicy]{max: 16}
	trafficPol   = &internTable[v1.ServiceInternalTrafficPolicy]{max: 16}
	ipModes      = &internTable[v1.LoadBalancerIPMode]{max: 16}
)

func (t *internTable[T]) intern(p *T) *T {
	if p == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if q, ok := t.table[*p]; ok {
		return q
	}
	if t.table == nil || len(t.table) >= t.max {
		t.table = make(map[T]*T)
	}
	t.table[*p] = p
	return p
}

// share returns s backed by the one copy the unique package holds.
func share[S ~string](s S) S {
	if s == "" {
		return s
	}
	return S(unique.Make(string(s)).Value())
}

// The IP family lists a Service can have, shared: [IPv4], [IPv6] and
// the two dual-stack orders. Capacity equals length, so an append makes
// a new array instead of writing into the shared one.
var familyLists = [][]v1.IPFamily{
	{v1.IPv4Protocol}, {v1.IPv6Protocol},
	{v1.IPv4Protocol, v1.IPv6Protocol}, {v1.IPv6Protocol, v1.IPv4Protocol},
}

func shareFamilies(f []v1.IPFamily) []v1.IPFamily {
	for _, l := range familyLists {
		if slices.Equal(f, l) {
			return l[:len(l):len(l)]
		}
	}
	return f
}

// shareService points s's repeated values at shared copies.
func shareService(s *v1.Service) {
	s.Namespace = share(s.Namespace)
	sp := &s.Spec
	sp.Type, sp.SessionAffinity = share(sp.Type), share(sp.SessionAffinity)
	sp.ExternalTrafficPolicy = share(sp.ExternalTrafficPolicy)
	sp.IPFamilies = shareFamilies(sp.IPFamilies)
	sp.IPFamilyPolicy = familyPolicy.intern(sp.IPFamilyPolicy)
	sp.InternalTrafficPolicy = trafficPol.intern(sp.InternalTrafficPolicy)
	if len(sp.ClusterIPs) > 0 && sp.ClusterIP == sp.ClusterIPs[0] {
		sp.ClusterIP = sp.ClusterIPs[0] // the API server sends it twice
	}
	for i := range sp.Ports {
		p := &sp.Ports[i]
		p.Name, p.Protocol = share(p.Name), share(p.Protocol)
		p.TargetPort.StrVal = share(p.TargetPort.StrVal)
		p.AppProtocol = appProtocols.intern(p.AppProtocol)
	}
	for i := range s.Status.LoadBalancer.Ingress {
		in := &s.Status.LoadBalancer.Ingress[i]
		in.IPMode = ipModes.intern(in.IPMode)
	}
}

// sharePorts returns a copy of ports, exactly as long, whose values
// point at shared copies.
func sharePorts(ports []discovery.EndpointPort) []discovery.EndpointPort {
	if len(ports) == 0 {
		return nil
	}
	out := make([]discovery.EndpointPort, len(ports))
	for i, p := range ports {
		out[i] = discovery.EndpointPort{Name: portNames.intern(p.Name), Protocol: protocols.intern(p.Protocol),
			Port: portNumbers.intern(p.Port), AppProtocol: appProtocols.intern(p.AppProtocol)}
	}
	return out
}
