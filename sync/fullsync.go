package sync

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"

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
//     pass, beside the sync loop, before the pass begins (passread.go: at
//     100,000 services the read takes seconds, and no change waits for
//     it; the first pass after start-up takes the start-up read instead,
//     kept true by every write since: StartPassRead); the real servers of a service's virtual servers are read
//     just before its step, beside the loop (readahead.go), or in the
//     step itself, and a read that one of ipvsproxy's writes may have
//     made stale is read again in the step, so the adoption and the
//     writes that follow see the kernel as it is;
//   - every sync, in the pass or between its steps, updates the pass's
//     snapshot with what it removed and added (the record tells the
//     snapshots it is watched by: record.store, noteSynced), so a later
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
	r       *Reconciler
	snap    *kernelSnapshot
	keys    *keyWalk // the services still to do
	failed  map[string]error
	adopted int
	pruner  *pruner // the last phase (prune.go); nil until it begins
	// ahead reads the next services' real servers beside the loop; nil
	// when the Reconciler does not read ahead (SetPassReadAhead).
	ahead *realsAhead
	// waiting: the last step stopped at a service whose read ahead had
	// not ended (PassStepReady).
	waiting    bool
	readInStep int // virtual servers whose real servers a step read itself
	// reals is the services whose real servers the pass reads
	// (realscheck.go); fromRecords counts the virtual servers whose real
	// servers it took from their records instead.
	reals       realsWindow
	fromRecords int
}

// readTimes sums a pass's kernel reads, logged once per pass at -v=2.
type readTimes struct {
	total, longest time.Duration
	longestWhat    string
}

func (t *readTimes) add(what string, d time.Duration) {
	t.total += d
	if d > t.longest {
		t.longest, t.longestWhat = d, what
	}
}

func (t *readTimes) report() {
	klog.V(2).InfoS("Full pass read the kernel", "took", t.total, "longestRead", t.longestWhat, "longestReadTook", t.longest)
}

// FullSyncResult says what a full pass found and did.
type FullSyncResult struct {
	Services int              // the services the pass went over
	Failed   map[string]error // per service key; retry these
	Prune    error            // failures removing objects nobody wants
	Adopted  int              // service keys whose kernel state was read back
	// The virtual servers whose real servers were read ahead of their
	// step and used, and those read in the step (not read ahead, or the
	// read ahead was stale).
	RealsReadAhead, RealsReadInStep int
	// RealsFromRecords: the virtual servers whose real servers the pass
	// took from their records, their service outside its window
	// (realscheck.go).
	RealsFromRecords int
}

// StepResult says what one step of a full pass did.
type StepResult struct {
	// Failed holds the services that failed in this step; retry these.
	Failed map[string]error
	// Done: the pass has no service left and has checked every object
	// it read for the prune; FinishPass is next.
	Done bool
}

// ErrPassRead is wrapped by BeginPass's error when the pass's read of
// the kernel failed.
var ErrPassRead = errors.New("full pass: read kernel state")

// BeginPass starts a full pass over keys (the services the proxy knows;
// services with an applied record are added) from read, the kernel's
// addresses, set entries and virtual servers read since StartPassRead
// (passread.go). A pass already running is abandoned. When the read
// failed, no pass begins and its error is returned: without a true
// picture of the kernel, the records are kept as they are.
func (r *Reconciler) BeginPass(keys PassKeys, read *PassRead) error {
	r.DropPassRead(read)
	r.endPass()
	if read.err != nil {
		return read.err
	}
	snap := read.snap
	if read.fromStartup {
		klog.V(2).InfoS("Full pass begins from the start-up read, kept true since")
	} else {
		read.took.report()
		snap.settle(r.rec, read.journal)
	}
	r.endAdoption() // the pass's snapshot replaces the start-up read (or is it)
	r.pass = &fullPass{
		r:      r,
		snap:   snap,
		keys:   &keyWalk{keys: keys},
		failed: map[string]error{},
		reals:  newRealsWindow(keys.sorted, r.realsFrom, keys.readReals),
	}
	r.rec.watch(snap)
	if r.readAhead {
		r.pass.ahead = newRealsAhead(r.kernel.IPVS, keys.sorted, r.pass.reals)
		r.rec.watch(r.pass.ahead)
	}
	return nil
}

// endPass forgets the running pass, if any.
func (r *Reconciler) endPass() {
	if r.pass != nil {
		r.rec.unwatch(r.pass.snap)
		if a := r.pass.ahead; a != nil {
			r.rec.unwatch(a)
			a.stop()
		}
		r.pass.keys.stop()
		if r.pass.pruner != nil {
			r.pass.pruner.stop()
		}
		r.pass = nil
	}
}

// PassRunning reports whether a full pass has begun and not finished.
func (r *Reconciler) PassRunning() bool { return r.pass != nil }

// StepPass adopts and syncs the pass's next services, building each
// one's desired state with want when its turn comes, and then prunes
// (prune.go), until stop reports true (asked after each service and each
// object the prune checks; at least one is done).
func (r *Reconciler) StepPass(want func(key string) *ServiceState, stop func() bool) StepResult {
	p := r.pass
	if p == nil {
		return StepResult{Done: true}
	}
	var res StepResult
	fail := func(key string, err error) {
		if res.Failed == nil {
			res.Failed = map[string]error{}
		}
		res.Failed[key] = errors.Join(res.Failed[key], err)
		p.failed[key] = res.Failed[key]
	}
	stopped := false
	p.waiting = false
	// The step's new objects wait and go many per round trip (deferred.go).
	deferring := r.write.deferring
	r.write.deferring = true
	for !stopped {
		if p.waitForRead() {
			break
		}
		key, more := p.keys.next(r.rec.applied)
		if !more {
			break
		}
		if key != "" {
			if err := p.syncKey(key, want(key)); err != nil {
				fail(key, err)
			}
		}
		stopped = stop()
	}
	r.write.deferring = deferring
	if !deferring {
		for key, err := range r.FlushWrites() {
			fail(key, err)
		}
	}
	if !stopped && !p.waiting {
		res.Done = p.pruneStep(stop)
	}
	return res
}

// waitForRead asks for the reads ahead of the pass's position and reports
// whether the service there waits for one (the step stops).
func (p *fullPass) waitForRead() bool {
	a := p.ahead
	if a == nil {
		return false
	}
	pos := p.keys.pos
	if pos >= len(a.keys) {
		a.stop() // the sorted keys are done; the rest are read in their step
		return false
	}
	a.fill(pos, p.r.rec, p.snap)
	p.waiting = a.waiting(pos)
	return p.waiting
}

// PassStepReady returns a channel ready when the running pass's next step
// can make progress: at once, unless the last step stopped for a read
// ahead, then when the reader has gone on. Nil when no pass runs.
func (r *Reconciler) PassStepReady() <-chan struct{} {
	switch {
	case r.pass == nil:
		return nil
	case r.pass.waiting:
		return r.pass.ahead.arrived
	default:
		return closed
	}
}

// SetPassReadAhead makes the full passes begun from now read the real
// servers of the next services beside the loop (readahead.go). Off, as
// tools and most tests want it, each step reads its services' own.
func (r *Reconciler) SetPassReadAhead(on bool) { r.readAhead = on }

// syncKey is one service's share of a full pass: adopt from the pass's
// snapshot, sync, and retire the real servers the kernel has and the
// service does not want.
func (p *fullPass) syncKey(key string, w *ServiceState) error {
	r := p.r
	if w == nil {
		w = &ServiceState{}
	}
	r.write.settle(key) // before its record is read back
	// Never adopt what another key owns (Sync would only leave it out).
	w, conflicts := r.withoutConflicts(key, w)
	if !p.reals.reads(key) {
		p.fromRecords += p.snap.loadRealsFromRecord(r.rec, key, w)
	}
	var ahead []aheadRead
	if p.ahead != nil {
		ahead = p.ahead.take(key)
	}
	readNow, err := p.snap.loadRealsOf(r.kernel.IPVS, r.rec, key, w, ahead)
	p.readInStep += readNow
	if err != nil {
		return fmt.Errorf("read real servers: %w", err)
	}
	if !r.rec.isReadBack(key, w, p.snap) {
		r.rec.forget(key)
		r.rec.adopt(key, w, p.snap)
	}
	if r.rec.applied[key] != nil {
		p.adopted++
	}
	err = r.Sync(key, w)
	err = errors.Join(err, conflicts, p.pruneReals(key))
	p.snap.release(w)
	return err
}

// FinishPass ends the pass, pruning what StepPass has not yet checked:
// the owned virtual servers, addresses and set entries that were in the
// kernel when the pass began and that no service references now.
func (r *Reconciler) FinishPass() FullSyncResult {
	p := r.pass
	if p == nil {
		return FullSyncResult{}
	}
	for !p.pruneStep(func() bool { return false }) {
	}
	r.endPass()
	r.rec.released = nil
	r.realsFrom = p.reals.next
	res := FullSyncResult{Services: p.keys.synced, Failed: p.failed, Prune: errors.Join(p.pruner.errs...), Adopted: p.adopted,
		RealsReadInStep: p.readInStep, RealsFromRecords: p.fromRecords}
	if p.ahead != nil {
		res.RealsReadAhead = p.ahead.used
	}
	return res
}

// pruneReals retires the real servers of key's virtual servers that the
// pass read from the kernel and that key does not want (a backend added
// behind ipvsproxy's back, or left by an earlier run).
func (p *fullPass) pruneReals(key string) error {
	r := p.r
	st := r.rec.applied[key]
	if st == nil {
		return nil
	}
	var errs []error
	for _, v := range st.VirtualServers {
		kv := p.snap.vs[v.VS.ServiceKey]
		if kv == nil || !kv.loaded {
			continue
		}
		for _, rs := range kv.reals {
			if slices.ContainsFunc(v.Reals, func(x ipvs.RealServer) bool { return x.RealKey == rs.RealKey }) ||
				r.drain.isDraining(v.VS.ServiceKey, rs.RealKey) {
				continue
			}
			if err := r.drain.retire(v.VS.ServiceKey, rs); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) excluded(a netip.Addr) bool { return owned.Excluded(r.exclude, a) }

// SetNodePortAddresses tells the reconciler the addresses node ports are
// served on now (the builder's Config.NodePortAddresses): the full pass
// prunes a TCP/UDP node-port virtual server nobody wants only on those
// (see owned.Ownership).
func (r *Reconciler) SetNodePortAddresses(addrs []netip.Addr) {
	r.nodePorts = slices.Clone(addrs)
}

// ownership is the ownership rule over snap, the node-port addresses and
// the excluded CIDRs.
func (r *Reconciler) ownership(snap *kernelSnapshot) owned.Ownership {
	return owned.Ownership{Bound: snap.addrs, Entries: snap.entries, NodePorts: r.nodePorts, Exclude: r.exclude}
}
