package sync

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// A full pass's read of the kernel runs beside the sync loop, not in it:
// at 10,000 services the dumps of the addresses, the sets and the virtual
// servers took 0.6–0.9 s in the sandbox (one dump alone up to 1.8 s on a
// loaded host), and every change that arrived meanwhile waited for them.
// Now the loop goes on syncing while another goroutine reads into a
// snapshot of its own, and the pass begins from it (BeginPass).
//
// What the loop writes while the read runs, the read may have seen before
// the write, after it or — the kernel resumes each part of a dump by
// position, so a deletion shifts what follows — not at all. A journal
// (writeJournal) notes the key of every object a sync adds or removes
// meanwhile, and BeginPass settles each of them from the records, which
// say what ipvsproxy left in the kernel. An object nobody touched is as
// the read found it. Someone else's change during the read is found by
// the next pass, as one made just after a read in the loop would be.

// PassRead is a full pass's read of the kernel. StartPassRead makes it in
// the sync loop, Run reads on any goroutine (it touches nothing of the
// Reconciler's), and BeginPass, back in the loop, begins the pass from it.
type PassRead struct {
	snap    *kernelSnapshot // its maps are made by Run, at size
	size    snapshotSize
	reads   []kernelRead
	journal *writeJournal
	took    readTimes
	err     error
	// fromStartup: snap is the start-up read, kept true since (no reads,
	// no journal).
	fromStartup bool
}

// StartPassRead flushes the deferred writes (the read must see them) and
// journals every write from now until BeginPass or DropPassRead.
//
// While the start-up read is in use (BeginAdoption, until a pass begins),
// the first pass begins from it instead of reading the kernel again: it
// has been kept true by every write since (noteSynced), and it holds the
// real servers of every virtual server a service adopted or ipvsproxy
// created, so the pass reads nothing. At 100,000 services the fresh read
// and its 102,004 real-server dumps were 137 s of the 456 s from start to
// Ready in the sandbox (docs/benchmarks.md, session 17), spent finding
// again what the proxy had just written. The pass still goes over every
// service and prunes what the start-up read found and no service wants;
// a change made by someone else after the start-up read is found by the
// next pass, a SyncPeriod later.
func (r *Reconciler) StartPassRead() *PassRead {
	r.write.flush()
	if r.startup != nil {
		return &PassRead{snap: r.startup, fromStartup: true}
	}
	snap := &kernelSnapshot{}
	j := newWriteJournal()
	r.rec.watch(j)
	return &PassRead{
		snap: snap, reads: snap.reads(r.kernel, r.sets), journal: j,
		// The kernel holds about what the records hold.
		size: snapshotSize{addrs: len(r.rec.addrRefs), vs: len(r.rec.vsOwner), entries: len(r.rec.entryRefs)},
	}
}

// ReadForPass is StartPassRead and Run in one go, in the caller's
// goroutine: for callers with nothing to do meanwhile (tools, tests).
func (r *Reconciler) ReadForPass() *PassRead {
	read := r.StartPassRead()
	_ = read.Run() // kept in read, reported by BeginPass
	return read
}

// Run reads the addresses, each owned set and the virtual servers, one
// dump each, and returns (and keeps, for BeginPass) the first failure.
func (p *PassRead) Run() error {
	if p.fromStartup {
		return nil
	}
	// Made here, beside the loop: at 100,000 services the maps are tens
	// of megabytes, 0.1 s on this host to make and clear the first time.
	p.snap.allocate(p.size)
	for _, read := range p.reads {
		start := time.Now()
		if err := read.do(); err != nil {
			p.err = fmt.Errorf("%w: %s: %w", ErrPassRead, read.what, err)
			return p.err
		}
		p.took.add(read.what, time.Since(start))
	}
	return nil
}

// DropPassRead stops the journal of a read that no pass will begin from.
func (r *Reconciler) DropPassRead(p *PassRead) {
	if p.journal != nil {
		r.rec.unwatch(p.journal)
	}
}

// writeJournal is the key of every object a sync added or removed while
// a pass's read ran: the addresses, set entries and virtual servers whose
// state the read cannot be trusted with.
type writeJournal struct {
	addrs   map[netip.Addr]struct{}
	entries map[owned.EntryKey]struct{}
	vs      map[ipvs.ServiceKey]struct{}
}

func newWriteJournal() *writeJournal {
	return &writeJournal{addrs: map[netip.Addr]struct{}{}, entries: map[owned.EntryKey]struct{}{}, vs: map[ipvs.ServiceKey]struct{}{}}
}

// noteSynced notes every object of old and now: what a sync removed and
// what it has (added, changed or left alone; the journal does not tell
// them apart, and settling an object the sync left alone changes
// nothing).
func (j *writeJournal) noteSynced(_ *record, old, now *ServiceState) {
	if old == now {
		return
	}
	for _, st := range [2]*ServiceState{old, now} {
		if st == nil {
			continue
		}
		for _, a := range st.Addresses {
			j.addrs[a] = struct{}{}
		}
		for _, e := range st.Entries {
			j.entries[owned.KeyOf(e)] = struct{}{}
		}
		for _, v := range st.VirtualServers {
			j.vs[v.VS.ServiceKey] = struct{}{}
		}
	}
}

// settle makes s, read while the syncs j journaled wrote, true for every
// object they touched: it is present when a record holds it — ipvsproxy
// bound, added or created it, or left it so — and absent otherwise. A
// virtual server the read did not find enters with the real servers its
// record holds (it was created during the read, or the read skipped it:
// either way, what ipvsproxy wrote); one it found takes the record's
// attributes, its real servers read when its service's turn comes.
func (s *kernelSnapshot) settle(rec *record, j *writeJournal) {
	for a := range j.addrs {
		if rec.addrRefs[a] > 0 {
			s.addrs[a] = true
		} else {
			delete(s.addrs, a)
		}
	}
	for k := range j.entries {
		if rec.entryRefs[k] > 0 {
			s.entries[k] = true
		} else {
			delete(s.entries, k)
		}
	}
	for k := range j.vs {
		var v *VirtualServerState
		if owner, held := rec.vsOwner[k]; held {
			v = findIn(rec.applied[owner], k)
		}
		switch kv := s.vs[k]; {
		case v == nil:
			delete(s.vs, k)
		case kv != nil:
			kv.set(v.VS)
		default:
			s.vs[k] = writtenVS(v)
		}
	}
}
