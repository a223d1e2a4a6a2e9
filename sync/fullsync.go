package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// kernelSnapshot is one read of everything ipvsproxy may own: the
// addresses on kube-ipvs0, every virtual server (with the real servers of
// those ipvsproxy owns), and the entries of its sets.
type kernelSnapshot struct {
	addrs   map[netip.Addr]bool
	vs      map[ipvs.ServiceKey]*kernelVS
	entries map[SetEntry]bool
}

type kernelVS struct {
	vs    ipvs.VirtualServer
	reals []ipvs.RealServer // sorted; only listed for owned virtual servers
	owned bool
}

// FullSyncResult says what a full pass found and did.
type FullSyncResult struct {
	Failed  map[string]error // per service key; retry these
	Prune   error            // failures removing objects nobody wants
	Adopted int              // service keys whose kernel state was read back
}

// FullSync reads the kernel once, takes what it finds as the applied state
// of every wanted service (adoption: a restart writes nothing when the
// kernel already matches), syncs each service against it, and then prunes
// owned objects that no service wants. It repairs any drift: an object
// deleted, added or changed behind ipvsproxy's back.
//
// want must hold every service the proxy knows, including those whose state
// is empty. Objects ipvsproxy does not own — virtual servers on addresses
// that are not bound on kube-ipvs0, anything in an excluded CIDR, sets it
// did not create — are never touched.
func (r *Reconciler) FullSync(want map[string]*ServiceState) (FullSyncResult, error) {
	snap, err := r.snapshot(want)
	if err != nil {
		// Without a true picture of the kernel, keep the records we have.
		return FullSyncResult{}, fmt.Errorf("full sync: read kernel state: %w", err)
	}
	r.pending = nil
	r.adopt(want, snap)
	r.sizeSets(want)
	res := FullSyncResult{Failed: map[string]error{}, Adopted: len(r.applied)}
	for _, key := range sortedKeys(want) {
		if err := r.Sync(key, want[key]); err != nil {
			res.Failed[key] = err
		}
	}
	res.Prune = r.prune(snap)
	return res, nil
}

func (r *Reconciler) snapshot(want map[string]*ServiceState) (*kernelSnapshot, error) {
	snap := &kernelSnapshot{
		addrs:   map[netip.Addr]bool{},
		vs:      map[ipvs.ServiceKey]*kernelVS{},
		entries: map[SetEntry]bool{},
	}
	addrs, err := r.kernel.Dummy.ListAddresses()
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		snap.addrs[a] = true
	}
	for _, set := range r.sets {
		entries, err := r.kernel.IPSet.ListEntries(set)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			snap.entries[SetEntry{Set: set, Entry: e}] = true
		}
	}
	wanted := map[ipvs.ServiceKey]bool{}
	for _, st := range want {
		for _, v := range st.VirtualServers {
			wanted[v.VS.ServiceKey] = true
		}
	}
	vss, err := r.kernel.IPVS.ListVirtualServers()
	if err != nil {
		return nil, err
	}
	for _, v := range vss {
		kv := &kernelVS{vs: v, owned: wanted[v.ServiceKey] || !r.excluded(v.Address) && snap.owns(v.ServiceKey)}
		kv.vs.Stats = ipvs.Stats{}
		if kv.owned {
			reals, err := r.kernel.IPVS.ListRealServers(v.ServiceKey)
			if err != nil {
				return nil, err
			}
			slices.SortFunc(reals, func(a, b ipvs.RealServer) int { return compareRealKey(a.RealKey, b.RealKey) })
			kv.reals = reals
		}
		snap.vs[v.ServiceKey] = kv
	}
	return snap, nil
}

// owns reports whether a virtual server nobody wants any more is
// ipvsproxy's to remove: its address is bound on kube-ipvs0, or ipvsproxy's
// sets still describe it (a load-balancer or external IP that is local on
// another interface, a node port). A virtual server someone else made on
// the node's addresses is left alone.
func (s *kernelSnapshot) owns(k ipvs.ServiceKey) bool {
	if s.addrs[k.Address] {
		return true
	}
	v6 := k.Address.Is6()
	ipPort := ipset.Entry{IP: k.Address, Protocol: k.Protocol.String(), Port: k.Port}
	for _, set := range []string{SetClusterIP, SetExternalIP, SetLoadBalancer, SetNodePortSCTP} {
		if s.entries[SetEntry{Set: SetName(set, v6), Entry: ipPort}] {
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
	return s.entries[SetEntry{Set: SetName(bitmap, v6), Entry: ipset.Entry{Port: k.Port}}]
}

// adopt replaces the applied records with the part of each wanted state
// the kernel really holds, as the kernel holds it (a virtual server with
// another scheduler is recorded with the kernel's scheduler, so the Sync
// that follows updates it in place).
func (r *Reconciler) adopt(want map[string]*ServiceState, snap *kernelSnapshot) {
	r.resetRecords(len(want))
	for _, key := range sortedKeys(want) {
		r.adoptKey(key, want[key], snap)
	}
}

func (r *Reconciler) resetRecords(n int) {
	r.applied = make(map[string]*ServiceState, n)
	r.addrRefs = map[netip.Addr]int32{}
	r.entryRefs = map[SetEntry]int32{}
	r.setSize = map[string]int{}
	r.vsOwner = map[ipvs.ServiceKey]string{}
}

// adoptKey adds to key's applied record the objects of w that the snapshot
// shows in the kernel and the record does not hold yet.
func (r *Reconciler) adoptKey(key string, w *ServiceState, snap *kernelSnapshot) {
	have := r.applied[key]
	if have == nil {
		have = &ServiceState{}
	}
	got := &ServiceState{
		Addresses:      slices.Clone(have.Addresses),
		VirtualServers: slices.Clone(have.VirtualServers),
		Entries:        slices.Clone(have.Entries),
	}
	for _, a := range w.Addresses {
		if snap.addrs[a] && !slices.Contains(have.Addresses, a) {
			got.Addresses = append(got.Addresses, a)
			r.addrRefs[a]++
		}
	}
	for _, v := range w.VirtualServers {
		kv := snap.vs[v.VS.ServiceKey]
		if kv == nil {
			continue
		}
		if owner, taken := r.vsOwner[v.VS.ServiceKey]; taken && owner != key {
			continue
		}
		i := slices.IndexFunc(got.VirtualServers, func(x VirtualServerState) bool { return x.VS.ServiceKey == v.VS.ServiceKey })
		if i < 0 {
			r.vsOwner[v.VS.ServiceKey] = key
			got.VirtualServers = append(got.VirtualServers, VirtualServerState{VS: kv.vs})
			i = len(got.VirtualServers) - 1
		}
		rec := &got.VirtualServers[i]
		rec.Reals = slices.Clone(rec.Reals)
		sorted.Walk(kv.reals, v.Reals, func(a, b ipvs.RealServer) int { return compareRealKey(a.RealKey, b.RealKey) },
			func(ipvs.RealServer) {}, func(ipvs.RealServer) {},
			func(k, _ ipvs.RealServer) {
				if !slices.ContainsFunc(rec.Reals, func(x ipvs.RealServer) bool { return x.RealKey == k.RealKey }) {
					rec.Reals = append(rec.Reals, ipvs.RealServer{RealKey: k.RealKey, Weight: k.Weight})
				}
			})
	}
	for _, e := range w.Entries {
		if snap.entries[e] && !slices.Contains(have.Entries, e) {
			got.Entries = append(got.Entries, e)
			if r.entryRefs[e] == 0 {
				r.setSize[e.Set]++
			}
			r.entryRefs[e]++
		}
	}
	if got.Empty() {
		return
	}
	got.normalize()
	r.applied[key] = got
}

// BeginAdoption reads the kernel once at start-up, before the informers
// have delivered everything, so that each service can be adopted and
// programmed as soon as it arrives: at 100,000 services the first ones are
// in the kernel long before the last is listed. Until the first FullSync,
// Sync adopts from this snapshot what the kernel already holds (a restart
// still writes nothing) and nothing is pruned: a service not seen yet is
// not a service that was deleted.
func (r *Reconciler) BeginAdoption() error {
	snap, err := r.snapshot(nil)
	if err != nil {
		return fmt.Errorf("read kernel state: %w", err)
	}
	r.resetRecords(0)
	r.pending = snap
	return nil
}

// forgetRemoved keeps the start-up snapshot true after a Sync removed
// objects: a later adoption must not take them for present.
func (r *Reconciler) forgetRemoved(old, now *ServiceState) {
	for _, a := range old.Addresses {
		if r.addrRefs[a] == 0 {
			delete(r.pending.addrs, a)
		}
	}
	for _, e := range old.Entries {
		if r.entryRefs[e] == 0 {
			delete(r.pending.entries, e)
		}
	}
	for _, v := range old.VirtualServers {
		kv := r.pending.vs[v.VS.ServiceKey]
		if kv == nil {
			continue
		}
		if _, owned := r.vsOwner[v.VS.ServiceKey]; !owned {
			delete(r.pending.vs, v.VS.ServiceKey)
			continue
		}
		var still []ipvs.RealServer
		if rec := findIn(now, v.VS.ServiceKey); rec != nil {
			still = rec.Reals
		}
		kv.reals = slices.DeleteFunc(kv.reals, func(rs ipvs.RealServer) bool {
			return slices.ContainsFunc(v.Reals, func(x ipvs.RealServer) bool { return x.RealKey == rs.RealKey }) &&
				!slices.ContainsFunc(still, func(x ipvs.RealServer) bool { return x.RealKey == rs.RealKey })
		})
	}
}

func findIn(st *ServiceState, k ipvs.ServiceKey) *VirtualServerState {
	if st == nil {
		return nil
	}
	for i := range st.VirtualServers {
		if st.VirtualServers[i].VS.ServiceKey == k {
			return &st.VirtualServers[i]
		}
	}
	return nil
}

// prune removes owned kernel objects that no applied record references:
// virtual servers on ipvsproxy's addresses, real servers of its virtual
// servers, addresses on kube-ipvs0, and entries of its sets.
func (r *Reconciler) prune(snap *kernelSnapshot) error {
	var errs []error
	for _, k := range sortedVS(snap.vs) {
		kv := snap.vs[k]
		if !kv.owned {
			continue
		}
		owner, ok := r.vsOwner[k]
		if !ok {
			err := r.kernel.IPVS.DeleteVirtualServer(k)
			if ipvs.IsNotExist(err) {
				err = nil
			}
			if err := r.observe("virtual_server", "delete", err); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		rec := r.findVS(owner, k)
		for _, rs := range kv.reals {
			if rec != nil && slices.ContainsFunc(rec.Reals, func(x ipvs.RealServer) bool { return x.RealKey == rs.RealKey }) {
				continue
			}
			if r.isDraining(k, rs.RealKey) {
				continue
			}
			if err := r.retireReal(k, rs); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for a := range snap.addrs {
		if r.addrRefs[a] > 0 || r.excluded(a) {
			continue
		}
		if err := r.observe("address", "delete", r.kernel.Dummy.DeleteAddress(a)); err != nil {
			errs = append(errs, err)
		}
	}
	for e := range snap.entries {
		if r.entryRefs[e] > 0 {
			continue
		}
		if err := r.observe("set_entry", "delete", r.kernel.IPSet.DeleteEntry(e.Set, e.Entry)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) findVS(key string, k ipvs.ServiceKey) *VirtualServerState {
	st := r.applied[key]
	if st == nil {
		return nil
	}
	i, ok := slices.BinarySearchFunc(st.VirtualServers, k, func(v VirtualServerState, k ipvs.ServiceKey) int {
		return compareServiceKey(v.VS.ServiceKey, k)
	})
	if !ok {
		return nil
	}
	return &st.VirtualServers[i]
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedVS(m map[ipvs.ServiceKey]*kernelVS) []ipvs.ServiceKey {
	keys := make([]ipvs.ServiceKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareServiceKey)
	return keys
}
