package sync

import (
	"errors"
	"net/netip"

	"github.com/ipvsproxy/ipvsproxy/conntrack"
	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"slices"
)

// writer makes the kernel writes of one Sync: it diffs a service's want
// against its record and writes the difference, and changes the record
// only for what the kernel accepted. Shared objects are written by their
// first user and removed with their last (the record's reference counts).
type writer struct {
	kernel  owned.Kernel
	rec     *record
	drain   *drainer
	grow    *setGrower
	observe func(object, verb string, err error) error
	// node seeds the order real servers are added in (order.go).
	node string

	// Deferred writes (deferred.go).
	deferring      bool
	pending        *pendingWrites
	deferredFailed map[string]error // keys whose deferred writes were refused
}

// apply is Sync for a want without conflicts.
func (w *writer) apply(key string, want *ServiceState) error {
	w.settle(key)
	have := w.rec.of(key)
	if have.equal(want) {
		return nil // the common case of a full pass with no drift: no allocation
	}
	var errs []error
	got := &ServiceState{
		Addresses:      make([]netip.Addr, 0, len(want.Addresses)),
		VirtualServers: make([]VirtualServerState, 0, len(want.VirtualServers)),
		Entries:        make([]owned.SetEntry, 0, len(want.Entries)),
	}

	// Bind new addresses first, so a new virtual server answers at once.
	var unbind []netip.Addr
	sorted.Walk(have.Addresses, want.Addresses, netip.Addr.Compare,
		func(a netip.Addr) { unbind = append(unbind, a) },
		func(a netip.Addr) {
			if w.deferring && w.rec.addrRefs[a] == 0 {
				w.pending.addBind(key, a) // recorded when bound
				return
			}
			if err := w.bind(a); err != nil {
				errs = append(errs, err)
				return
			}
			got.Addresses = append(got.Addresses, a)
		},
		func(a, _ netip.Addr) { got.Addresses = append(got.Addresses, a) })

	var vsErrs []error
	got.VirtualServers, vsErrs = w.applyVSs(key, have.VirtualServers, want.VirtualServers, got.VirtualServers)
	errs = append(errs, vsErrs...)

	sorted.Walk(have.Entries, want.Entries, owned.CompareSetEntries,
		func(e owned.SetEntry) {
			if err := w.removeEntry(e); err != nil {
				errs = append(errs, err)
				got.Entries = append(got.Entries, e)
			}
		},
		func(e owned.SetEntry) {
			if w.deferring && w.rec.entryRefs[owned.KeyOf(e)] == 0 {
				w.pending.addEntry(key, e) // recorded when written
				return
			}
			if err := w.addEntry(e); err != nil {
				errs = append(errs, err)
				return
			}
			got.Entries = append(got.Entries, e)
		},
		func(e, _ owned.SetEntry) { got.Entries = append(got.Entries, e) })

	// Unbind last: the virtual servers on these addresses are gone by now.
	kept := false
	for _, a := range unbind {
		if err := w.unbind(a); err != nil {
			errs = append(errs, err)
			got.Addresses = append(got.Addresses, a)
			kept = true
		}
	}
	if kept {
		slices.SortFunc(got.Addresses, netip.Addr.Compare)
	}
	// A service whose removal failed keeps the entries it could not drop,
	// in the order the merge walk produced them, which is already sorted.
	// A sync that wrote nothing yet (its writes wait: at start-up, a
	// virtual server's first real servers) leaves the record alone: each
	// store updates the snapshot the first pass reads (noteSynced).
	if !got.equal(have) {
		w.rec.store(key, have, got)
	}
	if w.deferring {
		w.flushDue(w.pending.due())
	}
	return errors.Join(errs...)
}

// applyVSs takes key's virtual servers from have to want, and returns got
// with what the kernel holds of them afterwards appended.
func (w *writer) applyVSs(key string, have, want, got []VirtualServerState) ([]VirtualServerState, []error) {
	var errs []error
	sorted.Walk(have, want, compareVSS,
		func(o VirtualServerState) {
			if err := w.deleteVS(key, o); err != nil {
				errs = append(errs, err)
				got = append(got, o)
			}
		},
		func(n VirtualServerState) {
			if w.deferring {
				if err := w.deferVS(key, n); err != nil {
					errs = append(errs, err)
				}
				return // recorded when written
			}
			s, added, err := w.addVS(key, n)
			if err != nil {
				errs = append(errs, err)
			}
			if added {
				got = append(got, s)
			}
		},
		func(o, n VirtualServerState) {
			s, err := w.updateVS(key, o, n)
			if err != nil {
				errs = append(errs, err)
			}
			got = append(got, s)
		})

	return got, errs
}

func compareVSS(a, b VirtualServerState) int {
	return compareServiceKey(a.VS.ServiceKey, b.VS.ServiceKey)
}

func (w *writer) bind(a netip.Addr) error {
	if w.rec.addrRefs[a] == 0 {
		if err := w.observe("address", "add", w.kernel.Dummy.AddAddress(a)); err != nil {
			return err
		}
	}
	w.rec.addrRefs[a]++
	return nil
}

func (w *writer) unbind(a netip.Addr) error {
	if w.rec.addrRefs[a] <= 1 {
		if err := w.observe("address", "delete", w.kernel.Dummy.DeleteAddress(a)); err != nil {
			return err
		}
		delete(w.rec.addrRefs, a)
		return nil
	}
	w.rec.addrRefs[a]--
	return nil
}

func (w *writer) addEntry(e owned.SetEntry) error {
	k := owned.KeyOf(e)
	if w.rec.entryRefs[k] == 0 {
		if err := w.grow.ensureCapacity(e.Set, w.rec.setSize[e.Set]+1); err != nil {
			return err
		}
		err := w.kernel.IPSet.AddEntry(e.Set, e.Entry)
		if spec, ok := w.grow.specs[e.Set]; ok && errors.Is(err, ipset.ErrHashFull) {
			// The kernel's set is smaller than we thought (made by kube-
			// proxy or an older version, or re-created by hand): grow it
			// past what it holds and retry.
			if gerr := w.grow.grow(spec, 2*max(spec.MaxElem, ipset.DefaultMaxElem)); gerr == nil {
				err = w.kernel.IPSet.AddEntry(e.Set, e.Entry)
			}
		}
		if err := w.observe("set_entry", "add", err); err != nil {
			return err
		}
		w.rec.setSize[e.Set]++
	}
	w.rec.entryRefs[k]++
	return nil
}

func (w *writer) removeEntry(e owned.SetEntry) error {
	k := owned.KeyOf(e)
	if w.rec.entryRefs[k] <= 1 {
		if err := w.observe("set_entry", "delete", w.kernel.IPSet.DeleteEntry(e.Set, e.Entry)); err != nil {
			return err
		}
		delete(w.rec.entryRefs, k)
		w.rec.setSize[e.Set]--
		return nil
	}
	w.rec.entryRefs[k]--
	return nil
}

// addVS creates a virtual server and its real servers. It reports whether
// the virtual server now exists for key (it may, with only some of its real
// servers, when an error is also returned).
func (w *writer) addVS(key string, n VirtualServerState) (VirtualServerState, bool, error) {
	k := n.VS.ServiceKey
	if owner, taken := w.rec.ownerOther(key, k); taken {
		return VirtualServerState{}, false, &ConflictError{VS: k, Owner: owner}
	}
	// Someone (or a failed earlier attempt) may have left it there: then
	// it is updated, made ours.
	if err := w.putVS(n.VS, false); err != nil {
		return VirtualServerState{}, false, err
	}
	w.rec.vsOwner[k] = key
	got := VirtualServerState{VS: n.VS}
	var err error
	got.Reals, err = w.addReals(n.VS, slices.Clone(n.Reals), make([]ipvs.RealServer, 0, len(n.Reals)))
	return got, true, err
}

// addReals adds reals to vs in this node's order (realOrder) and returns
// got with those the kernel accepted, sorted again by key as the record
// keeps them.
//
// They go in one batched add (ipvs.AddRealServers: one round trip for up
// to 256, where one each took a round trip): a new virtual server with k
// endpoints costs 2 round trips, not k+1. The kernel applies the
// messages of a batch in order, so its list of real servers ends in the
// order one add after the other would have left it. Each real server's
// answer is then settled as a lone add's was (addedReal); an existing
// one's weight is restored after the batch rather than between two
// adds, which changes nothing: updating a real server does not move it
// in the list.
func (w *writer) addReals(vs ipvs.VirtualServer, reals, got []ipvs.RealServer) ([]ipvs.RealServer, error) {
	if len(reals) == 0 {
		return got, nil
	}
	realOrder(w.node, vs, reals)
	return w.addedReals(vs.ServiceKey, reals, w.kernel.IPVS.AddRealServers(vs.ServiceKey, reals), got)
}

// addedReals settles the kernel's answers to adding reals to k (refused:
// nil, or one error per real server) as addedReal does each, and returns
// got with those now in the kernel, sorted by key as the record keeps
// them.
func (w *writer) addedReals(k ipvs.ServiceKey, reals []ipvs.RealServer, refused []error, got []ipvs.RealServer) ([]ipvs.RealServer, error) {
	var errs []error
	for i, rs := range reals {
		var err error
		if refused != nil {
			err = refused[i]
		}
		if err := w.addedReal(k, rs, err); err != nil {
			errs = append(errs, err)
			continue
		}
		got = append(got, rs)
	}
	slices.SortFunc(got, compareReal)
	return got, errors.Join(errs...)
}

// putVS writes a virtual server: updated in place when it should exist,
// added when it should not, each falling back to the other when the
// kernel says otherwise. Only the write that counted is observed.
func (w *writer) putVS(vs ipvs.VirtualServer, exists bool) error {
	first, then, verb, other, fallBack := w.kernel.IPVS.AddVirtualServer, w.kernel.IPVS.UpdateVirtualServer, "add", "update", ipvs.IsExist
	if exists {
		first, then, verb, other, fallBack = then, first, other, verb, ipvs.IsNotExist
	}
	err := first(vs)
	if fallBack(err) {
		err, verb = then(vs), other
	}
	w.observe("virtual_server", verb, err)
	return err
}

// updateVS brings one existing virtual server of key's from o to n: its
// attributes in place (never delete and re-create, which would cut
// connections), then its real servers; new ones wait with the deferred
// writes when the caller defers them (recorded when written).
func (w *writer) updateVS(key string, o, n VirtualServerState) (VirtualServerState, error) {
	k := n.VS.ServiceKey
	var errs []error
	var added []ipvs.RealServer // added after the walk, in this node's order
	// Room for every wanted real server, unless new ones will wait with
	// the deferred writes: then for those kept.
	room := len(n.Reals)
	if w.deferring {
		room = len(o.Reals)
	}
	got := VirtualServerState{VS: o.VS, Reals: make([]ipvs.RealServer, 0, room)}
	if !o.VS.Equal(n.VS) {
		// In place; if it was deleted behind our back, it is added again.
		if err := w.putVS(n.VS, true); err != nil {
			errs = append(errs, err)
		} else {
			got.VS = n.VS
		}
	}
	sorted.Walk(o.Reals, n.Reals, compareReal,
		func(rs ipvs.RealServer) {
			if err := w.drain.retire(k, rs); err != nil {
				errs = append(errs, err)
				got.Reals = append(got.Reals, rs)
			}
		},
		func(rs ipvs.RealServer) {
			if added == nil {
				// At most every new one: one allocation, where growing
				// from nil made five for a service of ten endpoints.
				added = make([]ipvs.RealServer, 0, len(n.Reals))
			}
			added = append(added, rs)
		},
		func(ors, nrs ipvs.RealServer) {
			if ors.Weight == nrs.Weight {
				got.Reals = append(got.Reals, ors)
				return
			}
			if err := w.observe("real_server", "update", w.kernel.IPVS.UpdateRealServer(k, nrs)); err != nil {
				errs = append(errs, err)
				got.Reals = append(got.Reals, ors)
				return
			}
			w.drain.stop(k, nrs.RealKey)
			got.Reals = append(got.Reals, nrs)
		})
	if w.deferring && len(added) > 0 && got.VS.Equal(n.VS) {
		w.pending.addReals(key, n.VS, added, len(o.Reals) == 0)
		return got, errors.Join(errs...)
	}
	var addErr error
	got.Reals, addErr = w.addReals(n.VS, added, got.Reals)
	errs = append(errs, addErr)
	w.firstReals(k, len(o.Reals) == 0, len(got.Reals))
	return got, errors.Join(errs...)
}

// firstReals cleans the stale flows of a UDP virtual server that had no
// real server (hadNone) and has some now: datagrams sent while the
// service had no backend may have left conntrack entries that would keep
// them from reaching the new one.
func (w *writer) firstReals(k ipvs.ServiceKey, hadNone bool, has int) {
	if k.Protocol == ipvs.UDP && hadNone && has > 0 {
		w.drain.staleUDP(conntrack.Flow{Destination: k.Address, Port: k.Port})
	}
}

// addedReal settles the kernel's answer err to adding rs to k, and
// observes it as one write: a real server that is there already
// (typically a draining backend that came back) gets its weight back.
func (w *writer) addedReal(k ipvs.ServiceKey, rs ipvs.RealServer, err error) error {
	if ipvs.IsExist(err) {
		w.drain.stop(k, rs.RealKey)
		err = w.kernel.IPVS.UpdateRealServer(k, rs)
		return w.observe("real_server", "update", err)
	}
	return w.observe("real_server", "add", err)
}

func (w *writer) deleteVS(key string, o VirtualServerState) error {
	err := w.kernel.IPVS.DeleteVirtualServer(o.VS.ServiceKey)
	if ipvs.IsNotExist(err) {
		err = nil
	}
	if err := w.observe("virtual_server", "delete", err); err != nil {
		return err
	}
	if w.rec.vsOwner[o.VS.ServiceKey] == key {
		delete(w.rec.vsOwner, o.VS.ServiceKey)
	}
	w.drain.forgetVS(o.VS.ServiceKey)
	return nil
}
