package sync

import (
	"errors"
	"fmt"
)

// Adoption at start-up. BeginAdoption reads the kernel once, before the
// informers have delivered everything, so that each service can be
// adopted and programmed as soon as it arrives: at 100,000 services the
// first ones are in the kernel long before the last is listed. Until the
// first full pass has read the kernel afresh, the caller adopts each
// service from this read (Adopt) before it syncs it, so a restart still
// writes nothing, and nothing is pruned: a service not seen yet is not a
// service that was deleted.

// BeginAdoption reads the kernel and empties the record: what is already
// there is taken back service by service, by Adopt.
func (r *Reconciler) BeginAdoption() error {
	r.write.flush() // the read must see them, and the record is reset
	snap, err := readSnapshot(r.kernel, r.sets)
	if err != nil {
		return fmt.Errorf("read kernel state: %w", err)
	}
	r.endAdoption()
	r.rec.reset(0)
	r.startup = snap
	r.rec.watch(snap)
	return nil
}

// Adopt takes into key's record the objects of want that the start-up
// read found in the kernel (after leaving out what another key owns, as
// Sync will), reading the real servers of its virtual servers first. The
// Sync that follows then writes only what differs. A failed read is
// returned with the conflicts, as Sync returns them, and the caller skips
// the Sync. Without a start-up
// read in use (before BeginAdoption, or once a full pass has read the
// kernel) it does nothing.
func (r *Reconciler) Adopt(key string, want *ServiceState) error {
	snap := r.startup
	if snap == nil {
		return nil
	}
	if want == nil {
		want = &ServiceState{}
	}
	r.write.settle(key)
	w, conflicts := r.withoutConflicts(key, want)
	if _, err := snap.loadRealsOf(r.kernel.IPVS, r.rec, key, w, nil); err != nil {
		// As Sync would have said: the conflicts are reported either way.
		return errors.Join(fmt.Errorf("read real servers: %w", err), conflicts)
	}
	r.rec.adopt(key, w, snap)
	return nil
}

// endAdoption stops adopting from the start-up read.
func (r *Reconciler) endAdoption() {
	if r.startup != nil {
		r.rec.unwatch(r.startup)
		r.startup = nil
	}
}
