package sync

import (
	"errors"
	"net/netip"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// The kernel writes of one Sync, each changing the record only when the
// kernel accepted it.

func compareVSS(a, b VirtualServerState) int {
	return compareServiceKey(a.VS.ServiceKey, b.VS.ServiceKey)
}

func (r *Reconciler) bind(a netip.Addr) error {
	if r.rec.addrRefs[a] == 0 {
		if err := r.observe("address", "add", r.kernel.Dummy.AddAddress(a)); err != nil {
			return err
		}
	}
	r.rec.addrRefs[a]++
	return nil
}

func (r *Reconciler) unbind(a netip.Addr) error {
	if r.rec.addrRefs[a] <= 1 {
		if err := r.observe("address", "delete", r.kernel.Dummy.DeleteAddress(a)); err != nil {
			return err
		}
		delete(r.rec.addrRefs, a)
		return nil
	}
	r.rec.addrRefs[a]--
	return nil
}

func (r *Reconciler) addEntry(e owned.SetEntry) error {
	if r.rec.entryRefs[e] == 0 {
		if err := r.grow.ensureCapacity(e.Set, r.rec.setSize[e.Set]+1); err != nil {
			return err
		}
		err := r.kernel.IPSet.AddEntry(e.Set, e.Entry)
		if spec, ok := r.grow.specs[e.Set]; ok && errors.Is(err, ipset.ErrHashFull) {
			// The kernel's set is smaller than we thought (made by kube-
			// proxy or an older version, or re-created by hand): grow it
			// past what it holds and retry.
			if gerr := r.grow.grow(spec, 2*max(spec.MaxElem, ipset.DefaultMaxElem)); gerr == nil {
				err = r.kernel.IPSet.AddEntry(e.Set, e.Entry)
			}
		}
		if err := r.observe("set_entry", "add", err); err != nil {
			return err
		}
		r.rec.setSize[e.Set]++
	}
	r.rec.entryRefs[e]++
	return nil
}

func (r *Reconciler) removeEntry(e owned.SetEntry) error {
	if r.rec.entryRefs[e] <= 1 {
		if err := r.observe("set_entry", "delete", r.kernel.IPSet.DeleteEntry(e.Set, e.Entry)); err != nil {
			return err
		}
		delete(r.rec.entryRefs, e)
		r.rec.setSize[e.Set]--
		return nil
	}
	r.rec.entryRefs[e]--
	return nil
}

// addVS creates a virtual server and its real servers. It reports whether
// the virtual server now exists for key (it may, with only some of its real
// servers, when an error is also returned).
func (r *Reconciler) addVS(key string, n VirtualServerState) (VirtualServerState, bool, error) {
	k := n.VS.ServiceKey
	if owner, taken := r.rec.ownerOther(key, k); taken {
		return VirtualServerState{}, false, &ConflictError{VS: k, Owner: owner}
	}
	err := r.kernel.IPVS.AddVirtualServer(n.VS)
	if ipvs.IsExist(err) {
		// Someone (or a failed earlier attempt) left it there: make it ours.
		err = r.kernel.IPVS.UpdateVirtualServer(n.VS)
		r.observe("virtual_server", "update", err)
	} else {
		r.observe("virtual_server", "add", err)
	}
	if err != nil {
		return VirtualServerState{}, false, err
	}
	r.rec.vsOwner[k] = key
	got := VirtualServerState{VS: n.VS, Reals: make([]ipvs.RealServer, 0, len(n.Reals))}
	var errs []error
	for _, rs := range n.Reals {
		if err := r.addReal(k, rs); err != nil {
			errs = append(errs, err)
			continue
		}
		got.Reals = append(got.Reals, rs)
	}
	return got, true, errors.Join(errs...)
}

// updateVS brings one existing virtual server from o to n: its attributes
// in place (never delete and re-create, which would cut connections), then
// its real servers.
func (r *Reconciler) updateVS(o, n VirtualServerState) (VirtualServerState, error) {
	k := n.VS.ServiceKey
	var errs []error
	got := VirtualServerState{VS: o.VS, Reals: make([]ipvs.RealServer, 0, len(n.Reals))}
	if !o.VS.Equal(n.VS) {
		err := r.kernel.IPVS.UpdateVirtualServer(n.VS)
		if ipvs.IsNotExist(err) {
			err = r.kernel.IPVS.AddVirtualServer(n.VS)
			r.observe("virtual_server", "add", err)
		} else {
			r.observe("virtual_server", "update", err)
		}
		if err != nil {
			errs = append(errs, err)
		} else {
			got.VS = n.VS
		}
	}
	sorted.Walk(o.Reals, n.Reals, compareReal,
		func(rs ipvs.RealServer) {
			if err := r.drain.retire(k, rs); err != nil {
				errs = append(errs, err)
				got.Reals = append(got.Reals, rs)
			}
		},
		func(rs ipvs.RealServer) {
			if err := r.addReal(k, rs); err != nil {
				errs = append(errs, err)
				return
			}
			got.Reals = append(got.Reals, rs)
		},
		func(ors, nrs ipvs.RealServer) {
			if ors.Weight == nrs.Weight {
				got.Reals = append(got.Reals, ors)
				return
			}
			if err := r.observe("real_server", "update", r.kernel.IPVS.UpdateRealServer(k, nrs)); err != nil {
				errs = append(errs, err)
				got.Reals = append(got.Reals, ors)
				return
			}
			r.drain.stop(k, nrs.RealKey)
			got.Reals = append(got.Reals, nrs)
		})
	if k.Protocol == ipvs.UDP && len(o.Reals) == 0 && len(got.Reals) > 0 {
		// Datagrams sent while the service had no backend may have left
		// conntrack entries that would keep them from reaching the new one.
		r.drain.staleUDP(conntrack.Flow{Destination: k.Address, Port: k.Port})
	}
	return got, errors.Join(errs...)
}

func (r *Reconciler) addReal(k ipvs.ServiceKey, rs ipvs.RealServer) error {
	err := r.kernel.IPVS.AddRealServer(k, rs)
	if ipvs.IsExist(err) {
		// Typically a draining backend that came back: restore its weight.
		r.drain.stop(k, rs.RealKey)
		err = r.kernel.IPVS.UpdateRealServer(k, rs)
		return r.observe("real_server", "update", err)
	}
	return r.observe("real_server", "add", err)
}

func (r *Reconciler) deleteVS(key string, o VirtualServerState) error {
	err := r.kernel.IPVS.DeleteVirtualServer(o.VS.ServiceKey)
	if ipvs.IsNotExist(err) {
		err = nil
	}
	if err := r.observe("virtual_server", "delete", err); err != nil {
		return err
	}
	if r.rec.vsOwner[o.VS.ServiceKey] == key {
		delete(r.rec.vsOwner, o.VS.ServiceKey)
	}
	r.drain.forgetVS(o.VS.ServiceKey)
	return nil
}
