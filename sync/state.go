// Package sync turns Services and EndpointSlices into kernel IPVS state,
// incrementally.
//
// The flow is: informer events mark a service key dirty (Tracker); for a
// dirty key the desired kernel objects are computed by a pure function
// (Build); the Reconciler diffs them against what it last applied
// for that key and issues only the difference; the Runner batches dirty
// keys, retries failed ones with backoff, and every sync period runs a full
// pass that reads the kernel once and repairs drift.
package sync

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// VirtualServerState is one virtual server and the real servers it should
// balance to.
type VirtualServerState struct {
	VS    ipvs.VirtualServer
	Reals []ipvs.RealServer // sorted by ipvs.CompareRealKeys, unique
}

// ServiceState is every kernel object one Service needs. All slices are
// sorted and free of duplicates; sorted slices rather than maps keep the
// per-service record small when a node holds 100,000 services, and let two
// states be diffed with one merge walk.
type ServiceState struct {
	VirtualServers []VirtualServerState // sorted by compareServiceKey
	Addresses      []netip.Addr         // bound on kube-ipvs0; sorted
	Entries        []owned.SetEntry     // sorted by owned.CompareSetEntries
}

// Empty reports whether the state holds no kernel object.
func (s *ServiceState) Empty() bool {
	return len(s.VirtualServers) == 0 && len(s.Addresses) == 0 && len(s.Entries) == 0
}

// equal reports whether two states program the kernel identically.
func (s *ServiceState) equal(o *ServiceState) bool {
	return slices.Equal(s.Addresses, o.Addresses) && slices.Equal(s.Entries, o.Entries) &&
		slices.EqualFunc(s.VirtualServers, o.VirtualServers, func(a, b VirtualServerState) bool {
			return a.VS.Equal(b.VS) && slices.EqualFunc(a.Reals, b.Reals, func(x, y ipvs.RealServer) bool {
				return x.RealKey == y.RealKey && x.Weight == y.Weight
			})
		})
}

// normalize sorts every slice and drops duplicates, keeping the first of
// equal keys.
func (s *ServiceState) normalize() {
	slices.SortStableFunc(s.VirtualServers, func(a, b VirtualServerState) int {
		return compareServiceKey(a.VS.ServiceKey, b.VS.ServiceKey)
	})
	s.VirtualServers = slices.CompactFunc(s.VirtualServers, func(a, b VirtualServerState) bool {
		return a.VS.ServiceKey == b.VS.ServiceKey
	})
	for i := range s.VirtualServers {
		r := s.VirtualServers[i].Reals
		slices.SortStableFunc(r, func(a, b ipvs.RealServer) int { return ipvs.CompareRealKeys(a.RealKey, b.RealKey) })
		s.VirtualServers[i].Reals = slices.CompactFunc(r, func(a, b ipvs.RealServer) bool { return a.RealKey == b.RealKey })
	}
	slices.SortFunc(s.Addresses, netip.Addr.Compare)
	s.Addresses = slices.Compact(s.Addresses)
	slices.SortFunc(s.Entries, owned.CompareSetEntries)
	s.Entries = slices.Compact(s.Entries)
}

// compareServiceKey is the records' order: by address first, so that a
// service's virtual servers on one address sit together. It is not
// ipvs.CompareServiceKeys (ipvsadm's listing order, protocol before
// address) because the records' order decides the order of the kernel
// writes of a sync, which must not change.
func compareServiceKey(a, b ipvs.ServiceKey) int {
	if c := a.Address.Compare(b.Address); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Protocol, b.Protocol); c != 0 {
		return c
	}
	return cmp.Compare(a.Port, b.Port)
}
