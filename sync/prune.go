package sync

import (
	"errors"
	"iter"
	"maps"
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// The prune is the last phase of a full pass: it removes the owned
// virtual servers, addresses and set entries that were in the kernel when
// the pass began and that no record references now. It runs in steps,
// like the services before it: checking every object the pass read is
// O(N) — at 100,000 services 300,000 map lookups and, when it sorted
// every virtual server's key, 0.1 s on this host and 0.5–0.9 s in the
// sandbox, time in which the changes that arrived waited (bench100k's
// slowest changes during passes were the ones written just before a pass
// ended).
//
// Stepping is safe because each object is checked and, when stale,
// deleted in the same step, against the records as they are then; and
// the pass's snapshot stays watched until the prune ends, so an object a
// sync between two steps removed is gone from the snapshot and one it
// added is referenced. An object the iteration has already passed when a
// sync stops referencing it was deleted by that sync.

// pruner walks a pass's snapshot once, object by object, across steps.
type pruner struct {
	vs      func() (ipvs.ServiceKey, bool)
	addrs   func() (netip.Addr, bool)
	entries func() (owned.EntryKey, bool)
	stops   [3]func() // release the walks
	errs    []error
}

// newPruner walks snap's maps (iter.Pull: a walk that pauses between
// steps; Go allows the maps to change meanwhile, and an object added
// during the walk may or may not be visited — it is referenced anyway).
func newPruner(snap *kernelSnapshot) *pruner {
	p := &pruner{}
	p.vs, p.stops[0] = iter.Pull(maps.Keys(snap.vs))
	p.addrs, p.stops[1] = iter.Pull(maps.Keys(snap.addrs))
	p.entries, p.stops[2] = iter.Pull(maps.Keys(snap.entries))
	return p
}

// stop releases the walks (a finished walk needs none, but a pass
// abandoned halfway does).
func (p *pruner) stop() {
	for _, stop := range p.stops {
		stop()
	}
}

// staleObjects are what one prune step found that no record references.
type staleObjects struct {
	vs      []ipvs.ServiceKey
	addrs   []netip.Addr
	entries map[string][]ipset.Entry // by set
}

// pruneStep checks the pass's objects, virtual servers first, then
// addresses, then set entries, until stop reports true (asked after
// each object; at least one is checked), and deletes the stale ones. It
// reports whether every object has been checked.
func (p *fullPass) pruneStep(stop func() bool) bool {
	r := p.r
	r.write.flush() // the checks must see every reference
	if p.pruner == nil {
		p.pruner = newPruner(p.snap)
	}
	var stale staleObjects
	done := false
	for {
		if !p.checkNext(&stale) {
			done = true
			break
		}
		if stop() {
			break
		}
	}
	p.pruner.errs = append(p.pruner.errs, p.deleteVirtualServers(stale.vs),
		p.deleteAddresses(stale.addrs), r.deleteEntries(stale.entries))
	return done
}

// checkNext checks the next object of the walk and adds it to stale when
// no record references it; it reports false when none is left.
func (p *fullPass) checkNext(stale *staleObjects) bool {
	r, pr := p.r, p.pruner
	if k, ok := pr.vs(); ok {
		// A virtual server is the proxy's to remove when the ownership
		// rule gives it or a record held it during the pass.
		if _, wanted := r.rec.vsOwner[k]; !wanted && !r.excluded(k.Address) &&
			(r.rec.released[k] || r.ownership(p.snap).Owns(k)) {
			stale.vs = append(stale.vs, k)
		}
		return true
	}
	if a, ok := pr.addrs(); ok {
		if r.rec.addrRefs[a] == 0 && !r.excluded(a) {
			stale.addrs = append(stale.addrs, a)
		}
		return true
	}
	if k, ok := pr.entries(); ok {
		if r.rec.entryRefs[k] == 0 {
			if stale.entries == nil {
				stale.entries = map[string][]ipset.Entry{}
			}
			e := k.SetEntry()
			stale.entries[e.Set] = append(stale.entries[e.Set], e.Entry)
		}
		return true
	}
	return false
}

func (p *fullPass) deleteVirtualServers(keys []ipvs.ServiceKey) error {
	r := p.r
	var errs []error
	slices.SortFunc(keys, compareServiceKey)
	for _, k := range keys {
		err := r.kernel.IPVS.DeleteVirtualServer(k)
		if ipvs.IsNotExist(err) {
			err = nil
		}
		if err := r.observe("virtual_server", "delete", err); err != nil {
			errs = append(errs, err)
		}
		r.drain.forgetVS(k)
	}
	return errors.Join(errs...)
}

func (p *fullPass) deleteAddresses(addrs []netip.Addr) error {
	r := p.r
	var errs []error
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range addrs {
		if err := r.observe("address", "delete", r.kernel.Dummy.DeleteAddress(a)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteEntries deletes stale set entries, many per message: after
// kube-proxy, or many services deleted while the proxy was down, they can
// be most of a set.
func (r *Reconciler) deleteEntries(stale map[string][]ipset.Entry) error {
	var errs []error
	for _, set := range slices.Sorted(maps.Keys(stale)) {
		entries := stale[set]
		slices.SortFunc(entries, func(a, b ipset.Entry) int {
			return owned.CompareSetEntries(owned.SetEntry{Entry: a}, owned.SetEntry{Entry: b})
		})
		err := r.kernel.IPSet.DeleteEntries(set, entries)
		errs = append(errs, err)
		for _, e := range entries {
			r.observe("set_entry", "delete", entryErr(err, e))
		}
	}
	return errors.Join(errs...)
}

// entryErr is e's error in a batched call's err.
func entryErr(err error, e ipset.Entry) error {
	var ee *ipset.EntriesError
	if !errors.As(err, &ee) {
		return err
	}
	for _, f := range ee.Failed {
		if f.Entry == e {
			return f.Err
		}
	}
	return nil
}
