package sync

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// A full pass reads the kernel, takes what it finds as the applied state
// of every service (adoption: a restart writes nothing when the kernel
// already matches), syncs each service against it, and then prunes owned
// objects that no service wants. It repairs any drift: an object deleted,
// added or changed behind ipvsproxy's back.
//
// A pass is spread over many small steps (BeginPass, StepPass until done,
// FinishPass) so that the Runner can sync changed services between them:
// at tens of thousands of services a pass takes seconds to minutes, and a
// change must not wait for it. What makes that safe:
//   - the virtual servers, addresses and set entries are read once per
//     pass, one dump per step before any service's step (at 100,000
//     services the whole read takes seconds: a change waits for one dump,
//     not all); the real servers of a service's virtual servers are read
//     in its own step, right before it is adopted and synced, so the read
//     and the writes that follow see the same kernel;
//   - every sync, in the pass or between its steps, updates the pass's
//     snapshot with what it removed and added (noteSynced), so a later
//     adoption or the final prune never acts on a read that ipvsproxy's
//     own writes have made stale. Drift made by someone else after the
//     pass began is found by the next pass;
//   - the final prune removes only objects that were in the kernel when
//     the pass began and that no record references when it ends.
//
// Objects ipvsproxy does not own — virtual servers the ownership rule
// (Ownership) does not give it and no record held, anything in an
// excluded CIDR, sets it did not create — are never touched.
type fullPass struct {
	snap    *kernelSnapshot
	reads   []func() error // the snapshot's dumps not done yet
	keys    []string       // every key known when the pass began, sorted
	next    int            // keys[next:] are still to do
	failed  map[string]error
	adopted int
}

// FullSyncResult says what a full pass found and did.
type FullSyncResult struct {
	Failed  map[string]error // per service key; retry these
	Prune   error            // failures removing objects nobody wants
	Adopted int              // service keys whose kernel state was read back
}

// BeginPass starts a full pass over keys (the services the proxy knows;
// services with an applied record are added). It does no I/O: the pass's
// first steps read the kernel's addresses, set entries and virtual
// servers. A pass already running is abandoned.
func (r *Reconciler) BeginPass(keys []string) {
	snap := newKernelSnapshot()
	all := make(map[string]bool, len(keys)+len(r.applied))
	for _, k := range keys {
		all[k] = true
	}
	for k := range r.applied {
		all[k] = true
	}
	r.pass = &fullPass{
		snap:   snap,
		reads:  r.snapshotReads(snap),
		keys:   slices.Sorted(maps.Keys(all)),
		failed: map[string]error{},
	}
}

// ErrPassRead is the error StepPass reports under PassReadFailed when the
// kernel could not be read: the pass is abandoned and the records are
// kept as they are.
var ErrPassRead = errors.New("full pass: read kernel state")

// PassReadFailed is the key under which StepPass reports a failed kernel
// read: the Runner's full-pass key, which no service key equals.
const PassReadFailed = fullSyncKey

// PassRunning reports whether a full pass has begun and not finished.
func (r *Reconciler) PassRunning() bool { return r.pass != nil }

// StepPass does the pass's next kernel reads, then adopts and syncs its
// next services, building each one's desired state with want when its
// turn comes, until stop reports true (asked after each read and each
// service; at least one is done). It returns the services that failed in
// this step and whether the pass has no service left (FinishPass is
// next). A failed read abandons the pass and is reported under
// PassReadFailed, with done false.
func (r *Reconciler) StepPass(want func(key string) *ServiceState, stop func() bool) (map[string]error, bool) {
	p := r.pass
	if p == nil {
		return nil, true
	}
	for len(p.reads) > 0 {
		read := p.reads[0]
		p.reads = p.reads[1:]
		if err := read(); err != nil {
			// Without a true picture of the kernel, keep the records we have.
			r.pass = nil
			return map[string]error{PassReadFailed: fmt.Errorf("%w: %w", ErrPassRead, err)}, false
		}
		if len(p.reads) == 0 {
			r.pending = nil // the pass's read is newer than the start-up one
		}
		if stop() {
			return nil, false
		}
	}
	var failed map[string]error
	for p.next < len(p.keys) {
		key := p.keys[p.next]
		p.next++
		if err := r.passKey(key, want(key)); err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[key] = err
			p.failed[key] = err
		}
		if stop() {
			break
		}
	}
	return failed, p.next == len(p.keys)
}

// passKey is one service's share of a full pass.
func (r *Reconciler) passKey(key string, w *ServiceState) error {
	p := r.pass
	if w == nil {
		w = &ServiceState{}
	}
	// Never adopt what another key owns (Sync would only leave it out).
	w, conflicts := r.withoutConflicts(key, w)
	if err := r.loadRealsOf(key, w, p.snap); err != nil {
		return fmt.Errorf("read real servers: %w", err)
	}
	if !r.recordIsReadBack(key, w, p.snap) {
		r.forgetKey(key)
		r.adoptKey(key, w, p.snap)
	}
	if r.applied[key] != nil {
		p.adopted++
	}
	err := r.Sync(key, w)
	err = errors.Join(err, conflicts, r.pruneReals(key, p.snap))
	releaseReals(w, p.snap)
	return err
}

// releaseReals drops the real servers read for w's virtual servers once
// their service's step is done: the pass never needs them again (a sync of
// the service later in the pass finds them unloaded and leaves them so),
// and keeping them would hold a second copy of every real server of the
// node until the pass ends — 7 MB at 10,000 services, 70 MB at 100,000.
func releaseReals(w *ServiceState, snap *kernelSnapshot) {
	for _, v := range w.VirtualServers {
		if kv := snap.vs[v.VS.ServiceKey]; kv != nil {
			kv.reals, kv.loaded = nil, false
		}
	}
}

// recordIsReadBack reports whether key's applied record is exactly what
// adopting w from snap would make of it (forgetKey then adoptKey): the
// common case of a pass with no drift, checked without allocating so that
// such a pass does not rebuild every record.
func (r *Reconciler) recordIsReadBack(key string, w *ServiceState, snap *kernelSnapshot) bool {
	have := r.applied[key]
	if have == nil {
		have = &ServiceState{}
	}
	i := 0
	for _, a := range w.Addresses {
		if snap.addrs[a] {
			if i == len(have.Addresses) || have.Addresses[i] != a {
				return false
			}
			i++
		}
	}
	if i != len(have.Addresses) {
		return false
	}
	i = 0
	for _, e := range w.Entries {
		if snap.entries[e] {
			if i == len(have.Entries) || have.Entries[i] != e {
				return false
			}
			i++
		}
	}
	if i != len(have.Entries) {
		return false
	}
	i = 0
	for _, v := range w.VirtualServers {
		kv := snap.vs[v.VS.ServiceKey]
		if kv == nil {
			continue
		}
		if owner, taken := r.vsOwner[v.VS.ServiceKey]; taken && owner != key {
			continue
		}
		if i == len(have.VirtualServers) || !kv.loaded || !realsReadBack(have.VirtualServers[i], kv, v.Reals) {
			return false
		}
		i++
	}
	return i == len(have.VirtualServers)
}

// realsReadBack: rec is the kernel's virtual server kv with, in order and
// at the kernel's weights, the wanted real servers the kernel holds.
func realsReadBack(rec VirtualServerState, kv *kernelVS, wanted []ipvs.RealServer) bool {
	if rec.VS.ServiceKey != kv.vs.ServiceKey || !rec.VS.Equal(kv.vs) {
		return false
	}
	i, j := 0, 0
	for _, k := range kv.reals {
		for j < len(wanted) && ipvs.CompareRealKeys(wanted[j].RealKey, k.RealKey) < 0 {
			j++
		}
		if j == len(wanted) || wanted[j].RealKey != k.RealKey {
			continue // in the kernel, not wanted: not adopted
		}
		if i == len(rec.Reals) || rec.Reals[i].RealKey != k.RealKey || rec.Reals[i].Weight != k.Weight {
			return false
		}
		i++
	}
	return i == len(rec.Reals)
}

// FinishPass ends the pass: it removes the owned virtual servers,
// addresses and set entries that were in the kernel when the pass began
// and that no service references now.
func (r *Reconciler) FinishPass() FullSyncResult {
	p := r.pass
	if p == nil {
		return FullSyncResult{}
	}
	r.pass = nil
	res := FullSyncResult{Failed: p.failed, Prune: r.prune(p.snap), Adopted: p.adopted}
	r.released = nil
	return res
}

// AbortPass abandons a running pass without pruning (the node changed and
// a new pass must start with the change applied).
func (r *Reconciler) AbortPass() { r.pass = nil }

// FullSync runs a whole pass at once over want, which must hold every
// service the proxy knows, including those whose state is empty.
func (r *Reconciler) FullSync(want map[string]*ServiceState) (FullSyncResult, error) {
	r.BeginPass(slices.Collect(maps.Keys(want)))
	r.sizeSets(want)
	for {
		failed, done := r.StepPass(func(k string) *ServiceState { return want[k] }, func() bool { return false })
		if err := failed[PassReadFailed]; err != nil {
			return FullSyncResult{}, err
		}
		if done {
			break
		}
	}
	return r.FinishPass(), nil
}

func (r *Reconciler) resetRecords(n int) {
	r.applied = make(map[string]*ServiceState, n)
	r.addrRefs = map[netip.Addr]int32{}
	r.entryRefs = map[owned.SetEntry]int32{}
	r.setSize = map[string]int{}
	r.vsOwner = map[ipvs.ServiceKey]string{}
}

// forgetKey drops key's applied record and its share of the shared
// objects' reference counts, before the record is read back from the
// kernel. The kernel is not touched.
func (r *Reconciler) forgetKey(key string) {
	st := r.applied[key]
	if st == nil {
		return
	}
	for _, a := range st.Addresses {
		if r.addrRefs[a]--; r.addrRefs[a] <= 0 {
			delete(r.addrRefs, a)
		}
	}
	for _, e := range st.Entries {
		if r.entryRefs[e]--; r.entryRefs[e] <= 0 {
			delete(r.entryRefs, e)
			r.setSize[e.Set]--
		}
	}
	for _, v := range st.VirtualServers {
		if r.vsOwner[v.VS.ServiceKey] == key {
			delete(r.vsOwner, v.VS.ServiceKey)
			r.noteReleased(v.VS.ServiceKey)
		}
	}
	delete(r.applied, key)
}

// adoptKey adds to key's applied record the objects of w that the snapshot
// shows in the kernel and the record does not hold yet, as the kernel
// holds them (a virtual server with another scheduler is recorded with
// the kernel's scheduler, so the Sync that follows updates it in place).
// Real servers are adopted only for virtual servers whose real servers
// were loaded.
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
		r.adoptVS(key, got, v, snap.vs[v.VS.ServiceKey])
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

// adoptVS records in got the kernel's virtual server kv for the wanted v,
// with the wanted real servers the kernel holds.
func (r *Reconciler) adoptVS(key string, got *ServiceState, v VirtualServerState, kv *kernelVS) {
	if kv == nil {
		return
	}
	if owner, taken := r.vsOwner[v.VS.ServiceKey]; taken && owner != key {
		return
	}
	i := slices.IndexFunc(got.VirtualServers, func(x VirtualServerState) bool { return x.VS.ServiceKey == v.VS.ServiceKey })
	if i < 0 {
		r.vsOwner[v.VS.ServiceKey] = key
		got.VirtualServers = append(got.VirtualServers, VirtualServerState{VS: kv.vs})
		i = len(got.VirtualServers) - 1
	}
	rec := &got.VirtualServers[i]
	rec.Reals = slices.Clone(rec.Reals)
	sorted.Walk(kv.reals, v.Reals, func(a, b ipvs.RealServer) int { return ipvs.CompareRealKeys(a.RealKey, b.RealKey) },
		func(ipvs.RealServer) {}, func(ipvs.RealServer) {},
		func(k, _ ipvs.RealServer) {
			if !slices.ContainsFunc(rec.Reals, func(x ipvs.RealServer) bool { return x.RealKey == k.RealKey }) {
				rec.Reals = append(rec.Reals, ipvs.RealServer{RealKey: k.RealKey, Weight: k.Weight})
			}
		})
}

// BeginAdoption reads the kernel once at start-up, before the informers
// have delivered everything, so that each service can be adopted and
// programmed as soon as it arrives: at 100,000 services the first ones are
// in the kernel long before the last is listed. Until the first full pass
// begins, Sync adopts from this snapshot what the kernel already holds (a
// restart still writes nothing) and nothing is pruned: a service not seen
// yet is not a service that was deleted.
func (r *Reconciler) BeginAdoption() error {
	snap, err := r.snapshot()
	if err != nil {
		return fmt.Errorf("read kernel state: %w", err)
	}
	r.resetRecords(0)
	r.pending = snap
	return nil
}

// passSnapshot is the running pass's snapshot, nil when none runs.
func (r *Reconciler) passSnapshot() *kernelSnapshot {
	if r.pass == nil {
		return nil
	}
	return r.pass.snap
}

// pruneReals retires the real servers of key's virtual servers that the
// pass read from the kernel and that key does not want (a backend added
// behind ipvsproxy's back, or left by an earlier run).
func (r *Reconciler) pruneReals(key string, snap *kernelSnapshot) error {
	st := r.applied[key]
	if st == nil {
		return nil
	}
	var errs []error
	for _, v := range st.VirtualServers {
		kv := snap.vs[v.VS.ServiceKey]
		if kv == nil || !kv.loaded {
			continue
		}
		for _, rs := range kv.reals {
			if slices.ContainsFunc(v.Reals, func(x ipvs.RealServer) bool { return x.RealKey == rs.RealKey }) ||
				r.isDraining(v.VS.ServiceKey, rs.RealKey) {
				continue
			}
			if err := r.retireReal(v.VS.ServiceKey, rs); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// prune removes owned kernel objects that no applied record references:
// the virtual servers the ownership rule gives ipvsproxy or that it held
// during the pass, addresses on kube-ipvs0, and entries of its sets.
// Nothing in an excluded CIDR is touched.
func (r *Reconciler) prune(snap *kernelSnapshot) error {
	own := r.ownership(snap)
	var errs []error
	for _, k := range sortedVS(snap.vs) {
		if _, wanted := r.vsOwner[k]; wanted || r.excluded(k.Address) || !r.released[k] && !own.Owns(k) {
			continue
		}
		err := r.kernel.IPVS.DeleteVirtualServer(k)
		if ipvs.IsNotExist(err) {
			err = nil
		}
		if err := r.observe("virtual_server", "delete", err); err != nil {
			errs = append(errs, err)
		}
		delete(r.draining, k)
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

// noteReleased remembers, for the next prune, a virtual server a record
// held when a pass forgot the record to read it back: ipvsproxy made or
// adopted it, so it is its to prune even where the ownership rule no
// longer says so (a node port on an address the node lost). Kept on the
// reconciler, not the pass: a pass abandoned for a newer one must not
// lose it, since the forgotten record no longer names it.
func (r *Reconciler) noteReleased(k ipvs.ServiceKey) {
	if r.released == nil {
		r.released = map[ipvs.ServiceKey]bool{}
	}
	r.released[k] = true
}

func sortedVS(m map[ipvs.ServiceKey]*kernelVS) []ipvs.ServiceKey {
	return slices.SortedFunc(maps.Keys(m), compareServiceKey)
}
